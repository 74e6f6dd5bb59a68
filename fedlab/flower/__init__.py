"""fedlab on Flower: the book's FedAvg as a Flower ``ClientApp`` / ``ServerApp``, and transcripts of
what a real Flower server receives.

* :mod:`fedlab.flower.apps` (needs the ``flower`` extra, ``flwr[simulation]``): :func:`client_app`,
  :func:`server_app`, the :class:`Recorder` strategy wrapper and :func:`run` (a simulation: the client apps in
  Ray workers, :class:`~fedlab.flower.apps.RayGrid`, or in this process, :class:`~fedlab.flower.apps.LocalGrid`), with
  the server's ``aggregation``: Flower's central-DP wrappers (:class:`~fedlab.flower.apps.FixedClippingDP`) or
  Flower's SecAgg+ (:class:`~fedlab.flower.apps.SecAgg`), and the simulation's :class:`~fedlab.flower.apps.Engine`;
* :mod:`fedlab.flower.transcript` (no ``flwr`` needed): the transcript format and
  :func:`load_transcript`;
* :mod:`fedlab.flower.attacks` (no ``flwr`` needed): chapter 1a's DLG / iDLG, chapter 1c's passive
  membership inference and chapter 4's local-model reconstruction on a transcript, and chapter 1b's
  imprint attack and chapter 2b's per-item sums on the aggregate of a SecAgg+ run, and the malicious
  server inside SecAgg+ (false dropout, split view, model inconsistency);
* :mod:`fedlab.flower.secagg` (needs ``flwr`` and ``cryptography``): fedlab's SecAgg+ workflow (dropouts in
  any stage up to ``n - t``, a malicious server's hooks, a log of every stage) and Bonawitz et al.'s
  consistency round as a client mod (:func:`~fedlab.flower.secagg.consistency_mod`);
* :mod:`fedlab.flower.deploy`: a Flower App project for deployment mode, and a local SuperLink with
  SuperNodes (the ``flwr`` commands run as subprocesses).

``import fedlab`` never imports this package, and ``import fedlab.flower`` imports ``flwr`` only when
a name of :mod:`fedlab.flower.apps` is first used, so stored transcripts load without Flower.
"""
from __future__ import annotations

from .transcript import Reply, Transcript, TranscriptWriter, load_transcript

_APPS = ("fedavg_schedule", "client_app", "server_app", "Recorder", "ScheduledFedAvg", "run", "RayStartError", "FlowerRun",
         "LocalGrid", "RayGrid",
         "quiet_flower", "DP_MODES", "SECAGG_DEFAULTS", "secagg_config", "FixedClippingDP", "SecAgg", "Engine", "Timeouts")

__all__ = ["Reply", "Transcript", "TranscriptWriter", "load_transcript", *_APPS]


def __getattr__(name):
    if name in _APPS:
        from . import apps

        return getattr(apps, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
