"""LTLf formulas split into hierarchies: where a formula splits, the hierarchy is done on exactly the label
sequences on which MONA's automaton of the whole formula is (`equivalent(..., rewards=False)`: a product
over every label set, not samples); events in any order become choice states whose calls exclude each
other, simultaneous events included; a formula that does not split is one called machine; and
`env.rm.ltlf` with the option learner builds the split hierarchy."""
import pytest

from roborl.rm.hierarchy import flatten
from roborl.rm.ltlf import from_ltlf, ltlf_tree
from roborl.rm.ltlf_split import AnyOrder, Then, Whole, plan, split_ltlf

SPLITS = {
    "F(a & X F(b & X F(c)))": Then((Whole("F(a)"), Whole("F(b)"), Whole("F(c)"))),
    "F(a) & F(b) & F(c)": AnyOrder(("a", "b", "c")),
    "F(a & X(F(b) & F(c)))": Then((Whole("F(a)"), AnyOrder(("b", "c")))),
    "F(a & !c & X F(b & X F(a)))": Then((Whole("F(a & !(c))"), Whole("F(b)"), Whole("F(a)"))),
    "F(a & X F(b & X(c U d)))": Then((Whole("F(a)"), Whole("F((b & X((c U d))))"))),
    "F(a | b) & F(!a & c)": AnyOrder(("(a | b)", "(!(a) & c)")),
}
WHOLE = ["a U b", "F(a & F(b))", "!a U (b & X F(c))", "F(a & X F(b)) & F(c)"]


@pytest.mark.parametrize("formula", list(SPLITS) + WHOLE)
def test_the_split_hierarchy_is_done_where_the_whole_formula_is(formula):
    h = split_ltlf(formula)
    labels = sorted(h.labels)
    assert flatten(h).equivalent(from_ltlf(formula), labels, rewards=False)
    if formula in SPLITS:
        assert plan(ltlf_tree(formula)) == SPLITS[formula]
    else:  # a root calling the formula's one machine
        assert isinstance(plan(ltlf_tree(formula)), Whole) and h.depth == 2 and len(h.machines) == 2


def test_a_split_that_ignored_the_order_would_not_be_done_where_the_formula_is():
    """The product check can fail: a sequence's hierarchy is not done where its parts in any order are."""
    assert not flatten(split_ltlf("F(a & X F(b))")).equivalent(from_ltlf("F(a) & F(b)"), ["a", "b"], rewards=False)


def test_events_in_any_order_are_choices_with_calls_that_exclude_each_other():
    h = split_ltlf("F(a & X(F(b) & F(c)))")
    assert h.depth == 3 and set(h.choices) == {("any0", "s0")}  # nested below the root's first call
    contexts = {h.machines[e.call].edges[0].guard: e.guard for e in h.choices[("any0", "s0")]}
    assert contexts == {"b": "!(c)", "c": "!(b)", "b & c": "true"}  # what each callee starts on: its context
    config = h.initial
    for labels in [{"b"}, {"a"}]:  # b before a does not count
        config, _ = h.step(config, labels)
    assert config == (("root", "s1", 0.0),)  # F(a) returned; any0 is called on the next step's labels
    config, paid = h.step(config, {"b", "c"})  # both at once: the call of both, done in one step
    assert h.accepts(config) and paid == pytest.approx(2.0)  # the call's own 1, the root's 1 on return
    config = h.initial
    for labels in [{"a"}, {"c"}, set(), {"b"}]:
        config, _ = h.step(config, labels)
    assert h.accepts(config)


def test_a_repeated_sub_task_is_one_machine_called_twice():
    h = split_ltlf("F(a & X F(b & X F(a)))")
    assert sorted(h.machines) == ["f0", "f1", "root"]
    assert [e.call for e in h.machines["root"].edges] == ["f0", "f1", "f0"]


TOUR = "F(at_a & X F(at_b & X F(at_a & X F(at_c & X F(at_a & X F(at_b))))))"


def test_a_machine_waiting_for_a_label_pays_the_tasks_progress_term_as_the_hand_written_tour_does():
    from roborl.rm import load_hierarchy
    from roborl.tasks.tour import TourEnv

    labels, hand = list(TourEnv.label_names), load_hierarchy("tasks/tour.rm")
    split = split_ltlf(TOUR, TourEnv.label_progress)
    calls = [(e.call, h.call) for e, h in zip(split.machines["root"].edges, hand.machines["root"].edges, strict=True)]
    assert all(split.machines[mine].equivalent(hand.machines[theirs], labels) for mine, theirs in calls), calls
    bare = split_ltlf(TOUR)  # without the task's terms: done on the same traces, paying nothing while it waits
    assert bare.machines["f0"].equivalent(hand.machines["touch_a"], labels, rewards=False)
    assert not bare.machines["f0"].equivalent(hand.machines["touch_a"], labels)
    conjunction = split_ltlf("F(at_a & at_b & X F(at_c))", TourEnv.label_progress)  # no one label to approach
    assert conjunction.machines["f0"].terms == [] and conjunction.machines["f1"].terms == ["approach_c"]


def test_the_config_builds_the_split_hierarchy_for_the_option_learner():
    import torch

    from roborl.builder import make_env, refuse_spread_choices
    from roborl.config import load_config
    from roborl.errors import UserError
    from roborl.rm.hierarchy_env import HierarchyEnv

    cfg = load_config("configs/hrm_errands_options.yaml",
                      ["env.rm.machine=null", "env.rm.ltlf=F(at_a) & F(at_b) & F(at_c)"])
    env = make_env(cfg.env, 4, 0, torch.device("cpu"))
    try:
        assert isinstance(env, HierarchyEnv)
        assert sorted(t for m in env.machine.h.machines.values() for t in m.terms) == [
            "approach_a", "approach_b", "approach_c"]  # the task's progress terms, each paid by its event's machine
        assert set(env.machine.h.choices) == {("root", f"s{done}") for done in (0, 1, 2, 4)}  # 2+ events left
        env.reset()
        for _ in range(3):
            env.step(torch.zeros(4, env.action_dim))
        assert (env.chosen >= 0).all()  # resting in the root's first choice, each env pursues a call
        assert env.options.count == sum(len(m.states) for m in env.machine.h.machines.values())
    finally:
        env.close()
    flat = load_config("configs/hrm_errands_options.yaml",
                       ["env.rm.machine=null", "env.rm.ltlf=F(at_a) & F(at_b) & F(at_c)", "env.rm.learner=flat"])
    env = make_env(flat.env, 2, 0, torch.device("cpu"))
    try:  # a flat learner gets MONA's machine of the whole formula, as before
        assert not isinstance(env, HierarchyEnv)
    finally:
        env.close()
    spread = load_config("configs/hrm_errands_options.yaml", ["env.rm.machine=null", "resources.env_workers=2",
                                                               "env.rm.ltlf=F(at_a) & F(at_b) & F(at_c)"])
    with pytest.raises(UserError, match=r"F\(at_a\) & F\(at_b\) & F\(at_c\) has choice states"):
        refuse_spread_choices(spread)  # its calls are learned where the envs are stepped
    with pytest.raises(ValueError, match="does not parse"):
        split_ltlf("F(a &")
    with pytest.raises(ValueError, match=r"'F\(\(b & X\(G\(c\)\)\)\)': no finite trace guarantees it"):
        split_ltlf("F(a & X F(b & X G(c)))")  # F(a) could be called, the rest would never return
