"""Scheduler: token budget, chunked prefill, admission order and preemption victims."""

from __future__ import annotations

from engine_helpers import make_seq

from kubeinfer_runtime.engine.block_manager import BlockManager
from kubeinfer_runtime.engine.config import EngineConfig
from kubeinfer_runtime.engine.scheduler import Scheduler, SchedulerOutput
from kubeinfer_runtime.engine.sequence import Sequence, SequenceStatus


def make_scheduler(num_blocks: int = 64, policy: str = "fcfs", **config: object) -> Scheduler:
    settings = EngineConfig(model="unused", block_size=4, scheduling_policy=policy, **config)  # type: ignore[arg-type]
    return Scheduler(settings, BlockManager(num_blocks, 4, enable_prefix_caching=True))


def run(scheduler: Scheduler, out: SchedulerOutput) -> None:
    """What the engine does after the model ran: count computed tokens, append a token when due."""
    for seq, n in zip(out.seqs, out.num_new_tokens, strict=True):
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(1)


def scheduled(out: SchedulerOutput) -> dict[str, int]:
    return {seq.request_id: n for seq, n in zip(out.seqs, out.num_new_tokens, strict=True)}


def test_long_prompt_is_prefilled_in_chunks_while_decodes_go_first() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=10)
    short = make_seq([1, 2, 3], index=0)
    long = make_seq(list(range(25)), index=1, arrival=1.0)
    scheduler.add(short)
    scheduler.add(long)
    steps = []
    for _ in range(4):
        out = scheduler.schedule(now=0.0)
        steps.append(scheduled(out))
        run(scheduler, out)
    assert steps == [
        {"seq-0": 3, "seq-1": 7},
        {"seq-0": 1, "seq-1": 9},
        {"seq-0": 1, "seq-1": 9},
        {"seq-0": 1, "seq-1": 1},  # the long prompt is done: now both decode
    ]


def test_max_num_seqs_caps_running_sequences() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    for i in range(3):
        scheduler.add(make_seq([1, 2], index=i))
    out = scheduler.schedule(now=0.0)
    assert list(scheduled(out)) == ["seq-0", "seq-1"]
    assert len(scheduler.waiting) == 1


def test_priority_policy_admits_lowest_value_first_and_fcfs_ignores_it() -> None:
    for policy, expected in (("priority", ["seq-2", "seq-1"]), ("fcfs", ["seq-0", "seq-1"])):
        scheduler = make_scheduler(policy=policy, max_num_seqs=2)
        scheduler.add(make_seq([1], priority=5, arrival=0.0, index=0))
        scheduler.add(make_seq([1], priority=1, arrival=1.0, index=1))
        scheduler.add(make_seq([1], priority=0, arrival=2.0, index=2))
        assert list(scheduled(scheduler.schedule(now=0.0))) == expected


def _fill_cache(policy: str) -> tuple[Scheduler, list[Sequence]]:
    """Three running sequences that exactly fill a 6-block cache; the next decode needs a new block."""
    scheduler = make_scheduler(num_blocks=6, policy=policy)
    seqs = [
        make_seq([1] * 7, priority=0, arrival=0.0, index=0),
        make_seq([2] * 7, priority=9, arrival=1.0, index=1),  # least important under "priority"
        make_seq([3] * 7, priority=0, arrival=2.0, index=2),  # latest: the fcfs victim
    ]
    for seq in seqs:
        scheduler.add(seq)
    run(scheduler, scheduler.schedule(now=0.0))  # each now holds 8 tokens' worth: 2 blocks
    for seq in seqs:
        seq.token_ids.append(1)  # pretend one more decode happened, so the next one needs block 3
        seq.num_computed_tokens += 1
    return scheduler, seqs


def test_preemption_picks_lowest_priority_latest_request() -> None:
    for policy, victim in (("priority", 1), ("fcfs", 2)):
        scheduler, seqs = _fill_cache(policy)
        out = scheduler.schedule(now=1.0)
        assert seqs[victim].status is SequenceStatus.WAITING
        assert seqs[victim].num_computed_tokens == 0 and seqs[victim].block_table == []
        assert seqs[victim] not in out.seqs
        assert scheduler.num_preemptions == 1
        assert scheduler.waiting == [seqs[victim]]  # and nothing new was admitted this step


def test_preempted_request_keeps_its_first_scheduled_time_and_is_counted_once() -> None:
    scheduler, seqs = _fill_cache("fcfs")
    scheduler.schedule(now=1.0)
    victim = seqs[2]
    assert victim.first_scheduled_time == 0.0
    scheduler.remove(seqs[0])  # room again
    out = scheduler.schedule(now=2.0)
    assert victim in out.seqs and victim.first_scheduled_time == 0.0
    assert scheduler.prefix_cache_queries == 3 * 7


def test_removing_sequences_frees_their_blocks() -> None:
    scheduler = make_scheduler(num_blocks=8)
    waiting, running = make_seq([1] * 5, index=0), make_seq([2] * 5, index=1)
    scheduler.add(running)
    scheduler.schedule(now=0.0)
    scheduler.add(waiting)
    scheduler.remove(running)
    scheduler.remove(waiting)
    assert scheduler.block_manager.num_free_blocks == 8
    assert not scheduler.running and not scheduler.waiting
