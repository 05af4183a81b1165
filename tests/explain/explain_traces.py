"""Text and helpers the explain tests share (a module name unique across tests/)."""

import numpy as np

STABLE = (
    "You are the support assistant of a storage company. Answer in plain words, cite the manual, "
    "never guess, and keep every answer short. The manual covers quotas, snapshots, replication, "
    "billing, retention and access control. When a question is about billing, send the user to the "
    "billing portal. When a question is about access control, explain roles before permissions. "
    "Snapshots are read only. Replication is asynchronous across regions and synchronous inside one.\n"
)


def first_difference(a, b) -> int:
    n = min(len(a), len(b))
    different = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(different[0]) if different.size else n
