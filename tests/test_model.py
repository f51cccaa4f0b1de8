"""The model's rules, one by one, in our own words (the seed's tests are in test_seed.py)."""

import pytest

from decodesched.model import NO_DEADLINE_SLACK, DecodeSchedulerSim, replay


def sim_with(policy="fixed_priority", blocks=100, interval=4, requests=()):
    sim = DecodeSchedulerSim(policy=policy, free_kv_blocks=blocks, aging_interval=interval)
    for kw in requests:
        sim.enqueue(**kw)
    return sim


def req(rid, prompt=4, new=2, **kw):
    return dict(request_id=rid, prompt_len=prompt, max_new_tokens=new, **kw)


class TestSortKey:
    def test_each_field_breaks_ties_in_order(self):
        # phase beats cache beats priority beats total length beats id
        sim = sim_with(requests=[req(5, prompt=9, priority=0), req(4, prompt=9, priority=0)])
        assert sim.step()["request_id"] == 4  # only the id differs
        sim = sim_with(requests=[req(1, prompt=9), req(2, prompt=3)])
        assert sim.step()["request_id"] == 2  # shorter total length first
        sim = sim_with(requests=[req(1, prompt=3, priority=0), req(2, prompt=9, priority=1)])
        assert sim.step()["request_id"] == 2  # higher priority beats length
        sim = sim_with(requests=[req(1, priority=5), req(2, priority=0, cache_hit=True)])
        assert sim.step()["request_id"] == 2  # cache hit beats priority

    def test_total_length_counts_generated_tokens(self):
        sim = sim_with(requests=[req(1, prompt=4, new=3), req(2, prompt=5, new=3)])
        sim.queue[0].phase = sim.queue[1].phase = "decode"
        sim.queue[0].admitted = sim.queue[1].admitted = True
        sim.queue[0].generated_len = 2  # total 6 > 5
        assert sim.step()["request_id"] == 2

    def test_deadline_slack_only_under_deadline_policy(self):
        for policy in ("fixed_priority", "aging", "fcfs"):
            sim = sim_with(policy, requests=[req(1, priority=5), req(2, deadline_step=3)])
            assert sim.step()["request_id"] == 1, policy
        sim = sim_with("deadline", requests=[req(1, priority=5), req(2, deadline_step=3)])
        assert sim.step()["request_id"] == 2

    def test_slack_at_the_sentinel_ties_and_above_sorts_after(self):
        # remaining steps in prefill with new=2 is 3: slack = deadline - 0 - 3
        tie = NO_DEADLINE_SLACK + 3
        sim = sim_with("deadline", requests=[req(2, deadline_step=tie), req(1)])
        assert sim._schedule_key(sim.queue[0])[0] == NO_DEADLINE_SLACK
        assert sim.step()["request_id"] == 1  # tie on slack: the id decides
        sim = sim_with("deadline", requests=[req(1, deadline_step=tie + 1), req(2)])
        assert sim.step()["request_id"] == 2  # slack above the sentinel sorts after no deadline

    def test_overdue_slack_is_not_clamped(self):
        sim = sim_with("deadline", requests=[req(1, new=5, deadline_step=2), req(2, new=1, deadline_step=3)])
        assert [sim._schedule_key(r)[0] for r in sim.queue] == [2 - 6, 3 - 2]
        assert sim.step()["request_id"] == 1

    def test_fcfs_orders_by_enqueue_clock_then_id(self):
        sim = sim_with("fcfs", requests=[req(9, priority=0)])
        sim.step()
        sim.enqueue(**req(3, priority=9, cache_hit=True))
        sim.enqueue(**req(1, priority=0))
        # prefill first; among prefills the earlier enqueue (both at clock 1) then the id
        assert sim.step()["request_id"] == 1

    def test_aging_raises_priority_every_interval(self):
        sim = sim_with("aging", interval=3, requests=[req(1, priority=2)])
        got = []
        for wait in range(7):
            sim.queue[0].wait_steps = wait
            got.append(sim._effective_priority(sim.queue[0]))
        assert got == [2, 2, 2, 3, 3, 3, 4]


class TestCapacity:
    def test_admission_takes_blocks_and_finish_returns_them(self):
        sim = sim_with(blocks=5, requests=[req(1, new=1, required_blocks=3)])
        assert sim.step()["free_kv_blocks"] == 2
        assert sim.step()["free_kv_blocks"] == 5

    def test_single_victim_first_by_priority_then_blocks_then_id(self):
        sim = sim_with(blocks=6, requests=[
            req(1, new=5, priority=1, required_blocks=2),
            req(2, new=5, priority=0, required_blocks=2),
            req(3, new=5, priority=0, required_blocks=2),
        ])
        for _ in range(3):
            sim.step()
        assert sim.free_kv_blocks == 0
        sim.enqueue(**req(4, new=1, priority=5, required_blocks=2))
        ev = sim.step()
        assert ev["request_id"] == 4 and ev["preempted_request_id"] == 2  # lowest priority, then id

    def test_victim_order_prefers_more_blocks_among_equal_priority(self):
        sim = sim_with(blocks=5, requests=[req(1, new=5, required_blocks=2), req(2, new=5, required_blocks=3)])
        sim.step(), sim.step()
        sim.enqueue(**req(3, new=1, priority=1, required_blocks=1))
        assert sim.step()["preempted_request_id"] == 2

    def test_a_request_needing_two_victims_is_skipped(self):
        sim = sim_with(blocks=4, requests=[req(1, new=5, required_blocks=2), req(2, new=5, required_blocks=2)])
        sim.step(), sim.step()
        sim.enqueue(**req(3, new=1, priority=9, required_blocks=4))
        ev = sim.step()
        assert ev["request_id"] in (1, 2) and ev["preempted_request_id"] is None
        assert all(r.preemptions == 0 for r in sim.queue)

    def test_equal_priority_and_non_preemptible_are_protected(self):
        sim = sim_with(blocks=2, requests=[req(1, new=5, priority=3, required_blocks=2)])
        sim.step()
        sim.enqueue(**req(2, new=1, priority=3, required_blocks=2))
        assert sim.step()["request_id"] == 1
        sim = sim_with(blocks=2, requests=[req(1, new=5, priority=0, required_blocks=2, preemptible=False)])
        sim.step()
        sim.enqueue(**req(2, new=1, priority=3, required_blocks=2))
        assert sim.step()["request_id"] == 1

    def test_preempted_request_resumes_where_it_stopped(self):
        sim = sim_with(blocks=2, requests=[req(1, new=4, required_blocks=2)])
        sim.step(), sim.step()
        victim = sim.queue[0]
        assert victim.generated_len == 1
        sim.enqueue(**req(2, new=1, priority=1, required_blocks=2))
        sim.step()
        assert victim.status == "preempted" and victim.phase == "decode" and victim.generated_len == 1
        events = sim.run(20)
        resumed = [e for e in events if e["request_id"] == 1][2]
        assert resumed["action"] == "decode_one_step" and resumed["generated_len"] == 2


class TestWaitAndDeadline:
    def test_every_unfinished_candidate_but_the_chosen_waits(self):
        sim = sim_with(requests=[req(1, new=1), req(2, new=1), req(3, new=1)])
        sim.run(10)
        waits = {r.request_id: r.wait_steps for r in sim.queue}
        # prefill first: prefills at steps 0, 1, 2, then decodes at 3, 4, 5 (each finishes at once).
        # 1 waits at 1, 2; 2 waits at 0, 2, 3; 3 waits at 0, 1, 3, 4: finished ones stop waiting
        assert waits == {1: 2, 2: 3, 3: 4}

    def test_deadline_missed_after_advancing(self):
        sim = sim_with(requests=[req(1, new=2, deadline_step=3)])
        flags = [e["deadline_missed"] for e in sim.run(5)]
        assert flags == [False, False, False]
        sim = sim_with(requests=[req(1, new=2, deadline_step=2)])
        assert [e["deadline_missed"] for e in sim.run(5)] == [True, True, True]


class TestInputErrors:
    @pytest.mark.parametrize("kwargs", [
        dict(policy="lottery"), dict(free_kv_blocks=-1), dict(aging_interval=0),
    ])
    def test_bad_configuration(self, kwargs):
        with pytest.raises(ValueError):
            DecodeSchedulerSim(**kwargs)

    def test_bad_requests(self):
        sim = sim_with(requests=[req(1)])
        with pytest.raises(ValueError, match="duplicate"):
            sim.enqueue(**req(1))
        for bad in (dict(prompt=0), dict(new=0), dict(required_blocks=0)):
            with pytest.raises(ValueError):
                sim.enqueue(**req(2, **bad))
        sim.step()
        with pytest.raises(ValueError, match="deadline"):
            sim.enqueue(**req(3, deadline_step=1))  # not after the clock (1)
        with pytest.raises(ValueError):
            sim.run(-1)


class TestReplay:
    def rows(self, *specs):
        out = []
        for rid, arrival, new, kw in specs:
            row = dict(request_id=rid, arrival_step=arrival, prompt_len=2, max_new_tokens=new, priority=0,
                       cache_hit=False, required_blocks=1, deadline_step=None, preemptible=True)
            row.update(kw)
            out.append(row)
        return out

    def test_idle_gap_jumps_the_clock_without_waiting(self):
        out = replay(self.rows((1, 0, 1, {}), (2, 10, 1, {})))
        assert [e["step"] for e in out.events] == [0, 1, 10, 11]
        assert out.states[1].wait_steps == 0 and out.stop == "drained"

    def test_simultaneous_arrivals_enqueue_in_row_order(self):
        rows = self.rows((7, 3, 1, {}), (5, 3, 1, {}))
        sim_order = [r.request_id for r in replay(rows, policy="fcfs").states.values()]
        assert sim_order == [7, 5]
        # fcfs ties on the enqueue clock, so the id decides, not the row
        assert replay(rows, policy="fcfs").events[0]["request_id"] == 5

    def test_unservable_requests_are_reported(self):
        out = replay(self.rows((1, 0, 1, {"required_blocks": 9}), (2, 0, 2, {})), free_kv_blocks=4)
        assert out.stop == "stuck"
        assert out.states[0].status == "waiting" and out.states[0].wait_steps == 3
        assert out.states[1].done

    def test_max_steps_counts_steps_that_ran(self):
        out = replay(self.rows((1, 0, 1, {}), (2, 50, 1, {})), max_steps=3)
        assert [e["step"] for e in out.events] == [0, 1, 50] and out.stop == "max_steps"
        assert replay(self.rows((1, 0, 1, {})), max_steps=0).states == {}


class TestPolicyObjects:
    """`DecodeSchedulerSim` with a `decodesched.Policy` (SPEC section 8)."""

    def test_the_view_a_policy_sees(self):
        import numba

        from decodesched import Policy

        seen = {}

        @numba.njit
        def key(r, clock):
            return (r.request_id,)

        @numba.njit
        def priority(r, clock):
            return r.priority

        sim = sim_with(Policy("by_id", key=key, effective_priority=priority), blocks=1, requests=[
            req(1, prompt=3, new=2, priority=4, cache_hit=True, required_blocks=1, deadline_step=9),
            req(2, prompt=5, new=1, preemptible=False)])
        sim.step()
        sim.step()
        for state in sim.queue:
            seen[state.request_id] = sim._view(state)._asdict()
        assert seen[1] == dict(request_id=1, arrival_step=0, prompt_len=3, max_new_tokens=2, generated_len=1,
                               phase=1, priority=4, cache_hit=1, wait_steps=0, deadline_step=9, has_deadline=1,
                               preemptible=1, preemptions=0, admitted=1)
        assert seen[2] == dict(request_id=2, arrival_step=0, prompt_len=5, max_new_tokens=1, generated_len=0,
                               phase=0, priority=0, cache_hit=0, wait_steps=2, deadline_step=0, has_deadline=0,
                               preemptible=0, preemptions=0, admitted=0)
        sim.enqueue(**req(3))
        assert sim._view(sim.queue[-1]).arrival_step == 2  # the enqueue clock

    @pytest.mark.parametrize("policy", ["fixed_priority", "aging", "deadline", "fcfs"])
    @pytest.mark.parametrize("interval", [1, 3])
    def test_builtin_policies_step_as_their_names(self, policy, interval):
        from decodesched.policy import builtin

        requests = [req(1, prompt=4, new=3, priority=0, required_blocks=2, deadline_step=30),
                    req(2, prompt=2, new=2, priority=2, required_blocks=2, cache_hit=True),
                    req(3, prompt=6, new=4, priority=1, required_blocks=3, deadline_step=8, preemptible=False),
                    req(4, prompt=1, new=1, priority=-1, required_blocks=1)]
        named = sim_with(policy, blocks=4, interval=interval, requests=requests).run(50)
        # a Policy that carries no interval takes the simulator's, as the name does
        as_policy = sim_with(builtin(policy), blocks=4, interval=interval, requests=requests).run(50)
        assert as_policy == named and len(named) == 14
