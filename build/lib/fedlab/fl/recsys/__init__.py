"""Federated recommendation.

:mod:`.ratings`: federated matrix factorisation on like / dislike ratings (London 2020, Protocols
1-3); :mod:`.interactions`: FCF and FNCF on implicit interactions (Ammad-ud-din et al. 2019; the
models RAIFLE attacks).
"""
