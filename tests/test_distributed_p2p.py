"""Point-to-point between two pjrt processes: coalesced blocks of sends and receives (what
batch_isend_irecv and pipeline schedules issue) as XLA exchanges, bitwise equal to the
host-staged path; the cases that keep the host path (tests/distributed/case_p2p.py)."""
from __future__ import annotations

from tests.distributed.launch import expect_success, launch


def test_coalesced_send_recv_in_crossing_orders_run_as_xla_exchanges_bitwise_equal_to_host_staged():
    paths = [v["paths"] for v in expect_success(launch("p2p_exchange", 2, timeout=300))]
    for mine in paths:
        for label, taken in mine.items():
            if label.startswith(("crossing", "interleaved")):  # one exchange program per block, every message in it
                count = int(label.split(", ")[1].split()[0])
                assert taken == {"p2p_xla_exchanges": 1, "p2p_xla_messages": 2 * count,
                                 "p2p_host_messages": 0}, (label, taken)
        for label in ("shapes differ", "cpu on one end"):  # the host path, on both ranks
            assert mine[label]["p2p_xla_exchanges"] == 0 and mine[label]["p2p_host_messages"] > 0, (label, mine[label])
    assert paths[0] == paths[1]


def test_a_block_whose_peer_receives_outside_a_block_raises_on_both_ranks_at_the_timeout():
    values = [r.value for r in launch("p2p_unmatched", 2, timeout=120)]
    assert all(v is not None and not v["failures"] for v in values), values
    assert "did not end a coalesced block" in values[0]["error"], values[0]
    assert values[1]["error"].startswith("CollectiveError: pjrt: recv from group rank 0"), values[1]
