"""Row operations: what the cascade does to a level's logits rows, on the host or on the rows'
device.

contract.py states the operations every kind of rows provides (RowOps) and the constants they
share; rows_numpy.py implements them for numpy rows (the reference), rows_torch.py for torch
tensors left on their device; rows.py hands out the operations of a row's kind (`ops_of`).
Nothing here knows a backend: a backend whose rows are of another kind registers that kind
(`rows.register`) when its module is imported.
"""
