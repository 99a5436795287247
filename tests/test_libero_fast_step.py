"""Our LIBERO step against LIBERO's own env, byte for byte: MuJoCo state after every sub-step,
robosuite's observations, rewards and success after every step, and the camera images.

The actions are the scripted expert's (approach, grasp, lift, carry, release: contacts throughout),
chosen from our env's observations; LIBERO's own ``ControlEnv`` gets the same actions in the same
process.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero

pytestmark = requires_libero


def _liberos_own_env(task, init_state, camera_size=None):
    """LIBERO's env as its own API makes it, reset the way ``LiberoSim`` resets (seed 0, no-op settle)."""
    from envs.libero.sim import NOOP_ACTION, _import_libero

    env_wrapper = _import_libero()
    if camera_size is None:
        env = env_wrapper.ControlEnv(
            bddl_file_name=task.bddl_file, use_camera_obs=False, has_renderer=False,
            has_offscreen_renderer=False, ignore_done=True,
        )  # fmt: skip
    else:
        env = env_wrapper.OffScreenRenderEnv(
            bddl_file_name=task.bddl_file, camera_heights=camera_size, camera_widths=camera_size
        )
    state = np.random.get_state()
    np.random.seed(0)
    env.reset()
    np.random.set_state(state)
    obs = env.set_init_state(init_state)
    for _ in range(10):
        obs = env.step(NOOP_ACTION.copy())[0]
    return env, obs


def _integration_state(data, model) -> bytes:
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION  # time, qpos, qvel, act, warm start, ctrl, applied forces...
    out = np.empty(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, data, out, spec)
    return out.tobytes()


def test_every_sub_step_equals_liberos_own_env_through_the_experts_grasps():
    from envs.core.spaces import FieldBox
    from envs.libero.sim import LiberoSim
    from envs.libero.suites import load_init_states, suite_tasks
    from envs.libero.task_state import TASK_STATE_FIELDS
    from policies.libero_expert import LiberoExpert

    task = suite_tasks("spatial")[0]
    init_state = load_init_states(task)[3]
    space = gym.spaces.Dict(task_state=FieldBox(-np.inf, np.inf, TASK_STATE_FIELDS))
    expert = LiberoExpert(space, gym.spaces.Box(-1, 1, (7,), np.float32))

    ref, ref_obs = _liberos_own_env(task, init_state)
    ref_model, ref_data = ref.env.sim.model._model, ref.env.sim.data._data
    ref_states: list[bytes] = []
    ref_sim_step = ref.env.sim.step

    def ref_step():  # LIBERO's own loop: record the state after each mj_step
        ref_sim_step()
        ref_states.append(_integration_state(ref_data, ref_model))

    ref.env.sim.step = ref_step
    sim = LiberoSim(cameras=(), task_state=True, object_state=True)  # every observable: compare all
    try:
        obs = sim.reset(task, init_state, scene_seed=0)
        scene = sim._scene
        assert scene.raw_obs.keys() == ref_obs.keys()
        assert all(np.array_equal(scene.raw_obs[k], ref_obs[k]) for k in ref_obs)
        ours: list[bytes] = []
        model, data = scene.inner.sim.model._model, scene.inner.sim.data._data
        scene.stepper.substep_hook = lambda: ours.append(_integration_state(data, model))
        gripper_closed = touching = False
        for step in range(300):
            chunk = expert.act({"task_state": obs["task_state"][None]}).actions.numpy()
            action = chunk[0, 0].astype(np.float64)
            ref_states.clear()
            ours.clear()
            ref_obs, ref_reward, ref_done, _ = ref.step(action.copy())
            out = sim.run_chunk(action[None], 1)
            obs = out.obs
            assert len(ours) == len(ref_states) == 25, step
            assert ours == ref_states, f"MuJoCo state differs within env step {step}"
            assert scene.raw_obs.keys() == ref_obs.keys()
            for key, value in ref_obs.items():
                assert np.array_equal(scene.raw_obs[key], value), (step, key)
            assert (float(out.rewards[0]), bool(out.success[0])) == (ref_reward, ref_done), step
            assert np.array_equal(sim.sim_state(), ref.get_sim_state())
            gripper_closed |= action[6] > 0
            touching |= any(
                "gripper0" in model.geom(c.geom1).name or "gripper0" in model.geom(c.geom2).name
                for c in data.contact[: data.ncon]
            )
            if ref_done:
                break
        assert ref_done and gripper_closed and touching, "the expert's episode must grasp and succeed"
    finally:
        sim.close()
        ref.close()


@pytest.mark.slow
def test_images_equal_liberos_offscreen_render_env():
    from envs.libero.sim import LiberoSim
    from envs.libero.suites import load_init_states, suite_tasks

    size = 64
    task = suite_tasks("goal")[2]
    init_state = load_init_states(task)[1]
    ref, ref_obs = _liberos_own_env(task, init_state, camera_size=size)
    sim = LiberoSim(image_size=size, upright=False)
    try:
        obs = sim.reset(task, init_state, scene_seed=0)
        actions = np.random.default_rng(0).uniform(-1, 1, (12, 7)) * 0.5
        for i, action in enumerate(actions):
            assert np.array_equal(obs["image"], ref_obs["agentview_image"]), i
            assert np.array_equal(obs["wrist_image"], ref_obs["robot0_eye_in_hand_image"]), i
            ref_obs = ref.step(action.copy())[0]
            obs = sim.run_chunk(action[None], 1).obs
    finally:
        sim.close()
        ref.close()


def test_an_env_it_cannot_reproduce_is_refused_by_name():
    from envs.libero.fast_step import FastStep
    from envs.libero.sim import LiberoSim
    from envs.libero.suites import load_init_states, suite_tasks

    task = suite_tasks("spatial")[0]
    sim = LiberoSim(cameras=(), settle_steps=0)
    try:
        sim.reset(task, load_init_states(task)[0], scene_seed=0)
        inner = sim._scene.inner
        inner.robots[0].controller.impedance_mode = "variable"
        with pytest.raises(NotImplementedError, match="impedance_mode 'fixed'"):
            FastStep(inner)
    finally:
        sim.close()
