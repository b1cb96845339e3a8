"""Controllers by name: each name of ``--controller`` gives its controller, an unknown name is refused."""

from __future__ import annotations

import pytest
from eerl.control.base import ControllerSettings
from eerl.control.registry import CONTROLLER_NAMES, DEFAULT_CONTROLLER, controller_factory
from eerl.errors import ConfigError
from eerl.phases import ControllerState, PhaseKind

from tests.client.control.synthetic import GRID_MHZ


class TestControllerFactory:
    @pytest.mark.parametrize(
        ("name", "state"),
        [("eerl", ControllerState.BASELINE), ("fixed", ControllerState.FIXED), ("off", ControllerState.OFF)],
    )
    def test_each_name_gives_a_controller_in_its_first_state(self, name: str, state: ControllerState) -> None:
        """The factory of each name builds a controller that starts in that controller's state."""
        assert set(CONTROLLER_NAMES) == {"eerl", "fixed", "off"}
        controller = controller_factory(name)(ControllerSettings(supported_sm_clocks_mhz=GRID_MHZ))
        assert controller.state_of(PhaseKind.GENERATION) is state

    def test_the_default_is_the_online_controller(self) -> None:
        """Without --controller, sessions get EE-RL."""
        assert DEFAULT_CONTROLLER == "eerl"

    def test_an_unknown_name_is_a_config_error_naming_the_choices(self) -> None:
        """The client's ConfigError (a ValueError) names the flag, the value and the known names."""
        with pytest.raises(ConfigError, match=r"--controller: unknown controller 'magic' \(choose from eerl"):
            controller_factory("magic")
