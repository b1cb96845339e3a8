"""Fixtures of the controller tests."""

from __future__ import annotations

import pytest
from eerl.control.base import ControllerSettings

from tests.client.control.synthetic import GRID_MHZ


@pytest.fixture
def settings() -> ControllerSettings:
    """A sync session over the H100 grid at the default threshold."""
    return ControllerSettings(supported_sm_clocks_mhz=GRID_MHZ)
