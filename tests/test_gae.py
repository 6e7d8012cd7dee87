import torch

from roborl.algos.advantages import bootstrap_timeouts, gae


def test_gae_matches_hand_computed_example():
    # one env, three steps, episode ends (terminates) after step 1
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    dones = torch.tensor([[False], [True], [False]])
    last_value = torch.tensor([2.0])
    gamma, lam = 0.9, 0.8
    adv, ret = gae(rewards, values, dones, last_value, gamma, lam)
    d2 = 3.0 + 0.9 * 2.0 - 1.5          # 3.3
    d1 = 2.0 - 1.0                      # 1.0 (episode ended: no bootstrap)
    d0 = 1.0 + 0.9 * 1.0 - 0.5          # 1.4
    a2, a1 = d2, d1
    a0 = d0 + gamma * lam * a1          # 2.12
    assert torch.allclose(adv[:, 0], torch.tensor([a0, a1, a2]))
    assert torch.allclose(ret, adv + values)


def test_lambda_one_gives_discounted_returns():
    torch.manual_seed(0)
    rewards, values = torch.rand(6, 3), torch.rand(6, 3)
    dones = torch.zeros(6, 3, dtype=torch.bool)
    last = torch.rand(3)
    _, ret = gae(rewards, values, dones, last, 0.95, 1.0)
    expect = last.clone()
    for t in reversed(range(6)):
        expect = rewards[t] + 0.95 * expect
        assert torch.allclose(ret[t], expect)


def test_timeout_bootstrap_keeps_the_value_of_the_future():
    """A truncated step must be worth r + γV(final_obs), a terminated one only r."""
    reward = torch.tensor([1.0, 1.0, 1.0])
    truncated = torch.tensor([True, False, False])
    final_value = torch.tensor([10.0, 10.0, 10.0])
    r = bootstrap_timeouts(reward, truncated, final_value, 0.9)
    assert torch.allclose(r, torch.tensor([10.0, 1.0, 1.0]))
    dones = torch.tensor([[True, True, False]])
    _, ret = gae(r[None], torch.zeros(1, 3), dones, torch.tensor([0.0, 0.0, 5.0]), 0.9, 0.95)
    assert torch.allclose(ret[0], torch.tensor([10.0, 1.0, 1.0 + 0.9 * 5.0]))
