"""The SEE bus: publish/subscribe, exact per-flow accounting, metrics, checkpointed totals, callback hooks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mutual_rl.exchange import (
    ExchangeAccountingError,
    ExchangeProtocolError,
    ExperienceExchange,
    records_from_group,
)
from tests.exchange.helpers import assert_groups_equal, make_group

POLICIES = ("a", "b", "c")


def publish_step(ex, step, n=(2, 3, 4), prompts=(11, 12)):
    """Each policy publishes one group per prompt; policy i's groups have n[i] responses."""
    ex.begin_step(step)
    out = {}
    for i, p in enumerate(POLICIES):
        out[p] = [make_group(p, q, 100 * i + q, n=n[i], step=step) for q in prompts]
        for g in out[p]:
            ex.publish(g)
    return out


def full_bus():
    ex = ExperienceExchange()
    for p in POLICIES:
        ex.subscribe(p, {"rollout", "reward", "advantage"}, regime="prp")
    return ex


def report_all_consumed(ex):
    for r in POLICIES:
        for s, gs in ex.deliveries(r).items():
            ex.report(r, s, consumed=sum(len(g.rollouts) for g in gs), dropped={})


def test_receivers_get_peers_groups_never_their_own():
    ex = full_bus()
    pub = publish_step(ex, 0)
    for r in POLICIES:
        d = ex.deliveries(r)
        assert sorted(d) == sorted(set(POLICIES) - {r})
        for s, gs in d.items():
            assert len(gs) == 2
            for g, h in zip(gs, pub[s]):
                assert_groups_equal(g, h)


def test_kinds_and_sources_filter_deliveries():
    ex = ExperienceExchange()
    ex.subscribe("a", set())  # regime "none": takes nothing
    ex.subscribe("b", {"reward"}, regime="xgrpo")  # reward-only: whole groups, counted in reward records
    ex.subscribe("c", {"rollout"}, sources=["a"])
    publish_step(ex, 0)
    assert ex.deliveries("a") == {}
    assert sorted(ex.deliveries("b")) == ["a", "c"]
    assert sorted(ex.deliveries("c")) == ["a"]
    ex.report("b", "a", consumed=4)  # 2 groups x 2 responses
    ex.report("b", "c", consumed=8)
    ex.report("c", "a", consumed=1, dropped={"gate_closed": 3})
    m = ex.end_step()
    assert m == {
        "exchange/a/published": 4.0, "exchange/b/published": 6.0, "exchange/c/published": 8.0,
        "exchange/a->b/delivered": 4.0, "exchange/a->b/consumed": 4.0,
        "exchange/c->b/delivered": 8.0, "exchange/c->b/consumed": 8.0,
        "exchange/a->c/delivered": 4.0, "exchange/a->c/consumed": 1.0, "exchange/a->c/dropped/gate_closed": 3.0,
    }
    with pytest.raises(ValueError, match="trace records are made on the receiver side"):
        ex.subscribe("a", {"trace"})


def test_exact_metrics_with_drops_and_split_reports():
    ex = full_bus()
    publish_step(ex, 5)
    ex.report("a", "b", consumed=2, dropped={"compat_below_floor": 1})
    ex.report("a", "b", consumed=1, dropped={"compat_below_floor": 1, "over_budget": 1})  # reports add up
    ex.report("a", "c", consumed=0, dropped={"gate_closed": 8})
    for r in ("b", "c"):
        for s, gs in ex.deliveries(r).items():
            ex.report(r, s, consumed=sum(len(g.rollouts) for g in gs))
    m = ex.end_step()
    assert m["exchange/b->a/delivered"] == 6 and m["exchange/b->a/consumed"] == 3
    assert m["exchange/b->a/dropped/compat_below_floor"] == 2 and m["exchange/b->a/dropped/over_budget"] == 1
    assert m["exchange/c->a/dropped/gate_closed"] == 8 and m["exchange/c->a/consumed"] == 0
    assert m["exchange/a->b/delivered"] == 4 and m["exchange/c->b/delivered"] == 8
    assert m["exchange/a->c/delivered"] == 4 and m["exchange/b->c/consumed"] == 6
    assert len([k for k in m if k.endswith("/delivered")]) == 6


def test_missing_report_raises_naming_the_flow():
    ex = full_bus()
    publish_step(ex, 2)
    report_all_consumed(ex)
    del ex._reports[("c", "b")]
    with pytest.raises(ExchangeAccountingError,
                       match=r"(?s)step 2.*receiver 'b' \(regime 'prp'\): 8 units delivered from 'c' were never reported"):
        ex.end_step()
    assert ex.step_open and ex.totals() == {}  # nothing counted; the step is still open


def test_mismatched_counts_raise_naming_the_flow_and_counts():
    ex = full_bus()
    publish_step(ex, 2)
    report_all_consumed(ex)
    ex._reports[("a", "c")].subtract({"consumed": 1})
    ex.report("c", "a", consumed=0, dropped={"over_budget": 0})
    with pytest.raises(ExchangeAccountingError) as e:
        ex.end_step()
    assert "receiver 'c' (regime 'prp'), source 'a': delivered 4 but consumed 3 + dropped {'over_budget': 0} = 3" \
        in str(e.value)


def test_reporting_an_undelivered_flow_raises():
    ex = ExperienceExchange()
    ex.subscribe("a", {"reward"}, sources=["b"])
    ex.subscribe("b", set())
    ex.subscribe("c", set())
    publish_step(ex, 0)
    ex.report("a", "b", consumed=6)
    ex.report("a", "c", consumed=0, dropped={"not_subscribed": 8})
    with pytest.raises(ExchangeAccountingError, match="reported .* from 'c', but nothing was delivered"):
        ex.end_step()


def test_totals_survive_state_dict_round_trip():
    ex = full_bus()
    for step in range(2):
        publish_step(ex, step)
        report_all_consumed(ex)
        ex.end_step()
    state = ex.state_dict()
    resumed = full_bus()
    resumed.load_state_dict(state)
    assert resumed.totals() == ex.totals() == {
        f"{s}->{r}": {"delivered": 2 * (2 * n), "consumed": 2 * (2 * n)}
        for r in POLICIES for s, n in zip(POLICIES, (2, 3, 4)) if s != r
    }
    for bus in (ex, resumed):
        publish_step(bus, 2)
        report_all_consumed(bus)
        bus.report("a", "b", consumed=0, dropped={})
        bus.end_step()
    assert resumed.totals() == ex.totals() and resumed.totals()["b->a"]["delivered"] == 18
    assert resumed.state_dict() == ex.state_dict()
    with pytest.raises(ValueError, match="state version"):
        resumed.load_state_dict({"version": 99})


def test_protocol_errors():
    ex = full_bus()
    g = make_group("a", 1, 1)
    with pytest.raises(ExchangeProtocolError, match="call begin_step"):
        ex.publish(g)
    ex.begin_step(0)
    ex.publish(g)
    with pytest.raises(ExchangeProtocolError, match="published twice"):
        ex.publish(g)
    with pytest.raises(ExchangeProtocolError, match="never subscribed"):
        ex.deliveries("zzz")
    with pytest.raises(ValueError, match="consumed must be an int >= 0"):
        ex.report("b", "a", consumed=-1)
    with pytest.raises(ExchangeProtocolError, match="was not ended"):
        ex.begin_step(1)


def test_publish_records_list():
    ex = full_bus()
    ex.begin_step(0)
    g = make_group("a", 1, 1)
    ex.publish(records_from_group(g))
    assert_groups_equal(ex.deliveries("b")["a"][0], g)


def test_callback_hooks_open_and_close_steps_and_log():
    ex = full_bus()
    logged = {}
    module = SimpleNamespace(log_dict=lambda m, **kw: logged.update(m))
    trainer = SimpleNamespace(global_step=7, is_global_zero=True)
    ex.setup(trainer, module, "fit")
    ex.on_train_batch_start(trainer, module, None, 0)
    assert ex.current_step == 7
    with pytest.raises(ExchangeProtocolError, match="step 7 is open"):  # one owner: no second open
        ex.begin_step(7)
    for p in POLICIES:
        ex.publish(make_group(p, 1, 1, n=2))
    report_all_consumed(ex)
    ex.on_train_batch_end(trainer, module, None, None, 0)
    assert not ex.step_open and logged["exchange/a->b/consumed"] == 2.0
    logged.clear()
    ex.on_train_batch_start(trainer, module, None, 1)
    assert ex.end_step() == {}  # the module ended the step itself: the hook then does nothing
    ex.on_train_batch_end(trainer, module, None, None, 1)
    assert logged == {}
    owner = SimpleNamespace(log_dict=lambda m, **kw: logged.update(m), owns_exchange_step=True)
    ex.on_train_batch_start(trainer, owner, None, 2)  # a module that runs the step itself: left alone
    assert not ex.step_open
    ex.begin_step(2)
    ex.on_train_batch_end(trainer, owner, None, None, 2)
    assert ex.step_open and ex.end_step() == {} and logged == {}
