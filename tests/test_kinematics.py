import mujoco
import numpy as np
import torch

from roborl.sim.kinematics import SerialChain, damped_least_squares
from roborl.tasks.arm import ASSETS


def test_forward_and_jacobian_match_mujoco():
    model = mujoco.MjModel.from_xml_path(str(ASSETS / "stack.xml"))
    data = mujoco.MjData(model)
    chain = SerialChain(model, "tcp")
    assert chain.dof == 7
    q = torch.rand(6, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3 - 1.5
    p, R, J = chain.jacobian(q)
    site = model.site("tcp").id
    for i in range(len(q)):
        data.qpos[:7] = q[i].numpy()
        mujoco.mj_forward(model, data)
        jp, jr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
        mujoco.mj_jacSite(model, data, jp, jr, site)
        np.testing.assert_allclose(p[i].numpy(), data.site_xpos[site], atol=1e-12)
        np.testing.assert_allclose(R[i].numpy().ravel(), data.site_xmat[site], atol=1e-12)
        np.testing.assert_allclose(J[i, :3].numpy(), jp[:, :7], atol=1e-12)
        np.testing.assert_allclose(J[i, 3:].numpy(), jr[:, :7], atol=1e-12)


def test_joint_limits_are_the_panda_datasheet():
    model = mujoco.MjModel.from_xml_path(str(ASSETS / "reach.xml"))
    chain = SerialChain(model, "tcp")
    upper = torch.tensor([2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973], dtype=torch.float64)
    assert torch.allclose(chain.upper, upper)
    assert torch.allclose(chain.lower[3], torch.tensor(-3.0718, dtype=torch.float64))


def test_damped_least_squares_is_the_pseudo_inverse_step_with_a_null_space_bias():
    gen = torch.Generator().manual_seed(1)
    jac = torch.randn(5, 6, 7, dtype=torch.float64, generator=gen)
    err = torch.randn(5, 6, dtype=torch.float64, generator=gen)
    bias = torch.randn(5, 7, dtype=torch.float64, generator=gen)
    damping = 0.05
    dq = damped_least_squares(err, jac, bias, damping)
    pinv = jac.transpose(1, 2) @ torch.linalg.inv(jac @ jac.transpose(1, 2) + damping**2 * torch.eye(6, dtype=jac.dtype))
    null = torch.eye(7, dtype=jac.dtype) - pinv @ jac
    expected = (pinv @ err[..., None] + null @ bias[..., None]).squeeze(-1)
    torch.testing.assert_close(dq, expected, rtol=1e-10, atol=1e-10)
    # undamped, the step reaches the task-space error exactly whatever the bias: the bias lives in J's null space
    exact = damped_least_squares(err, jac, bias, 1e-7)
    torch.testing.assert_close((jac @ exact[..., None]).squeeze(-1), err, rtol=0, atol=1e-8)


def test_the_orientation_holding_step_is_the_damped_step_on_its_position_and_rotation_errors():
    from roborl.sim.kinematics import orientation_hold_step
    from roborl.tasks.arm import HOME

    model = mujoco.MjModel.from_xml_path(str(ASSETS / "push.xml"))
    chain = SerialChain(model, "tcp")
    gen = torch.Generator().manual_seed(2)
    q = HOME + 0.3 * torch.randn(16, 7, dtype=torch.float64, generator=gen)
    p, R, J = chain.jacobian(q)
    down = chain.forward(HOME[None])[1][0]
    target = p + 0.05 * torch.randn(16, 3, dtype=torch.float64, generator=gen)
    rot_err = 0.5 * torch.linalg.cross(R, down.expand_as(R), dim=1).sum(-1)
    expected = damped_least_squares(torch.cat([target - p, rot_err], -1), J, 0.1 * (HOME - q), 0.05)
    torch.testing.assert_close(orientation_hold_step(q, target, p, R, J, down, HOME, 0.1, 0.05), expected,
                               rtol=1e-12, atol=1e-12)
    assert rot_err.abs().max() > 1e-2  # the rotation error is part of what was compared
