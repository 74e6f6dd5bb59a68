"""Client splits taken from specific papers.

* :func:`adult_phd_split` -- the non-iid split of UCI Adult used by Xu & Neglia (2021, Sec. 4).
"""
from __future__ import annotations

import numpy as np

__all__ = ["BACHELOR_OR_ABOVE", "adult_phd_split", "adult_phd_clients"]

#: Adult education levels at least "bachelor" (Xu & Neglia 2021, Sec. 4)
BACHELOR_OR_ABOVE = ("Bachelors", "Masters", "Prof-school", "Doctorate")


def adult_phd_split(education, age, *, num_other_clients: int = 7, young: int = 38, old: int = 52,
                    seed: int = 0) -> list[np.ndarray]:
    """Xu & Neglia (2021, Sec. 4) non-iid split of Adult over ``3 + num_other_clients`` clients.

    Only records with education at least "bachelor" are kept. The PhDs ("Doctorate") go to the first
    three clients by age: client 0 holds ``age < young``, client 1 holds ``young <= age <= old`` and
    client 2 holds ``age > old``. The remaining records are shuffled and dealt evenly over the other
    ``num_other_clients`` clients.

    Parameters
    ----------
    education : array of str, shape ``[n]`` (``Dataset.meta["education"]`` of :func:`load_adult`)
    age : array of int, shape ``[n]`` (``Dataset.meta["age"]``)

    Returns
    -------
    list of ``3 + num_other_clients`` sorted index arrays into the ``n`` records (disjoint).

    Raises
    ------
    ValueError
        If the arrays differ in length, ``num_other_clients < 1``, ``young > old``, or a PhD client
        would be empty.
    """
    education = np.asarray(education).astype(str)
    age = np.asarray(age)
    if education.shape != age.shape or education.ndim != 1:
        raise ValueError(f"education and age must be 1-d arrays of one length, got {education.shape} "
                         f"and {age.shape}")
    if int(num_other_clients) != num_other_clients or num_other_clients < 1:
        raise ValueError(f"num_other_clients must be a positive integer, got {num_other_clients}")
    if young > old:
        raise ValueError(f"young ({young}) must not exceed old ({old})")
    keep = np.isin(education, BACHELOR_OR_ABOVE)
    phd = keep & (education == "Doctorate")
    parts = [np.flatnonzero(phd & (age < young)),
             np.flatnonzero(phd & (age >= young) & (age <= old)),
             np.flatnonzero(phd & (age > old))]
    if min(len(p) for p in parts) == 0:
        raise ValueError("a PhD client would be empty: does the data hold Doctorate records?")
    rest = np.random.default_rng(seed).permutation(np.flatnonzero(keep & ~phd))
    parts += [np.sort(p) for p in np.array_split(rest, num_other_clients)]
    return parts


def adult_phd_clients(split: str = "train", *, num_other_clients: int = 7, seed: int = 0):
    """The clients of :func:`adult_phd_split` on :func:`fedlab.data.load_adult` ``(split)``.

    Returns a list of :class:`fedlab.data.Dataset`, one per client (``X`` ``[n_k, 104]``).
    """
    from . import client_datasets, load_adult

    ds = load_adult(split)
    parts = adult_phd_split(ds.meta["education"], ds.meta["age"],
                            num_other_clients=num_other_clients, seed=seed)
    return client_datasets(ds, parts)
