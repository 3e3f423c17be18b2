"""The batch ledger: each id ends once; duplicates are caught."""

from __future__ import annotations

import pytest

from rlinfra.driver.batches import BatchLedger, BatchLedgerError


def test_each_id_ends_once_and_the_summary_adds_up():
    ledger = BatchLedger()
    a, b, c, d = (ledger.issue(f"env:{i}") for i in range(4))
    ledger.trained([a], iteration=1)
    ledger.lost([b])
    ledger.dropped([c])
    assert ledger.open_ids == [d]
    ledger.trained([d], iteration=2)
    ledger.rolled_back(after_iteration=1)
    assert ledger.ended[d] == "rolled_back" and d not in ledger.trained_in
    assert ledger.summary() == {
        "issued": 4, "trained": 1, "dropped": 1, "lost": 1, "rolled_back": 1, "open": 0, "duplicated": 0,
    }  # fmt: skip


def test_a_batch_trained_twice_is_a_duplicate():
    ledger = BatchLedger()
    a = ledger.issue("env:0")
    ledger.trained([a])
    with pytest.raises(BatchLedgerError, match="trained after it was already trained"):
        ledger.trained([a])
    assert ledger.summary()["duplicated"] == 1


def test_a_lost_batch_can_never_be_trained():
    ledger = BatchLedger()
    a = ledger.issue("env:0")
    ledger.lost([a])
    with pytest.raises(BatchLedgerError, match="trained after it was already lost"):
        ledger.trained([a])
