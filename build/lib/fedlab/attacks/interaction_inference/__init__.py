"""Interaction inference: recovering which items a user interacted with from its federated update.

RAIFLE (Pham, Kulkarni & Houmansadr): :mod:`.recsys` attacks federated recommendation (FCF, FNCF,
Algorithms 1-2, Sec. 4.1), :mod:`.oltr` attacks federated online learning to rank (FPDGD, Sec. 4.2).
"""
