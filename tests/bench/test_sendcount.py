"""`bench._sendcount` reads strace's summary table."""

from __future__ import annotations

from bench._sendcount import parse_summary

SUMMARY = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 41.17    0.000849          13        62           recvmmsg
 30.02    0.000619          19        32           sendto
 19.98    0.000412          13        31        31 recvmsg
  8.83    0.000182           5        33           sendmmsg
------ ----------- ----------- --------- --------- ----------------
100.00    0.002062          13       158        31 total
"""


def test_the_summary_gives_calls_per_syscall_without_the_total() -> None:
    assert parse_summary(SUMMARY) == {"recvmmsg": 62, "sendto": 32, "recvmsg": 31,
                                      "sendmmsg": 33}


def test_no_table_is_no_calls() -> None:
    assert parse_summary("strace: Process 123 attached\n") == {}
