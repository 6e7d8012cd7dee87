import torch

from roborl.tasks.arm import CUBE_HALF
from roborl.tasks.stack import placing_reward


def test_stack_placing_reward_leads_over_the_base_not_into_its_side():
    """A held cube beside the base at its resting height (pressed against the base's side) earns less than the
    same cube lifted clear of the base's top, and the resting place on the base earns the most."""
    resting = torch.tensor([[0.55, 0.0, 3 * CUBE_HALF]], dtype=torch.float64)  # on a base resting on the table
    beside = resting + torch.tensor([[2 * CUBE_HALF + 0.005, 0.0, 0.0]], dtype=torch.float64)
    lifted = beside + torch.tensor([[0.0, 0.0, 0.03]], dtype=torch.float64)
    above = resting + torch.tensor([[0.0, 0.0, 0.01]], dtype=torch.float64)
    assert placing_reward(lifted, resting) > placing_reward(beside, resting) + 0.02
    assert placing_reward(resting, resting).item() == 1.0
    assert placing_reward(above, resting) < 1.0
    near = resting + torch.tensor([[0.005, 0.0, 0.0]], dtype=torch.float64)  # well within the 1.5 cm success band
    assert placing_reward(near, resting) > placing_reward(near + torch.tensor([[0.0, 0.0, 0.01]]), resting)
