"""One error tree: the shared concepts (a bad configuration value, a bad field) have one home, eerl.errors."""

from __future__ import annotations

import eerl.errors as shared
import pytest

from eerld import errors
from eerld.api.interceptors import status_code_for


class TestSharedConcepts:
    @pytest.mark.parametrize(
        ("daemon", "client"),
        [(errors.ConfigError, shared.ConfigError), (errors.ValidationError, shared.ValidationError)],
    )
    def test_the_daemons_error_is_the_shared_concept_and_a_daemon_error(
        self, daemon: type[Exception], client: type[Exception]
    ) -> None:
        """eerld's ConfigError and ValidationError derive from eerl's and from the daemon's root."""
        assert issubclass(daemon, client)
        assert issubclass(daemon, errors.DaemonError)
        assert issubclass(daemon, ValueError)

    def test_a_refused_field_is_caught_by_the_shared_class(self) -> None:
        """``except eerl.errors.ValidationError`` catches a field the daemon refused, field and all."""
        with pytest.raises(shared.ValidationError) as caught:
            raise errors.ValidationError("gpus[0]", "set index or uuid")
        assert (caught.value.field, caught.value.problem) == ("gpus[0]", "set index or uuid")
        assert str(caught.value) == "gpus[0]: set index or uuid"

    def test_the_mapping_to_status_codes_is_unchanged(self) -> None:
        """INVALID_ARGUMENT for a bad field, FAILED_PRECONDITION for bad configuration."""
        assert status_code_for(errors.ValidationError("f", "p")).name == "INVALID_ARGUMENT"
        assert status_code_for(errors.ConfigError("x")).name == "FAILED_PRECONDITION"


class TestDaemonRoot:
    def test_the_root_says_daemon(self) -> None:
        """Every branch of eerld's tree derives from DaemonError."""
        branches = (errors.GpuError, errors.NotFound, errors.Conflict, errors.PermissionDenied)
        assert all(issubclass(b, errors.DaemonError) for b in branches)
        assert errors.DaemonError.__name__ == "DaemonError"
