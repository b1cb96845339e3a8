"""Who owns a sidecar, in pure parts: the default socket's place, the secret, the request's head."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from eerl.errors import ConfigError
from eerl.sidecar._http import Head, HttpError, body_length, parse_head, response_bytes
from eerl.sidecar._owner import new_token, read_token_file, token_from_env, token_matches, write_token_file
from eerl.sidecar._paths import check_private_dir, default_address, socket_name

NOBODY = 65534


class TestDefaultAddress:
    def test_a_socket_name_is_the_job_id_made_safe_and_short(self) -> None:
        assert socket_name("grpo-7.1_a") == "sidecar-grpo-7.1_a.sock"
        odd = socket_name("../../etc/x y")
        assert "/" not in odd
        assert " " not in odd
        assert not odd.removeprefix("sidecar-").startswith(".")
        assert socket_name("a/b") != socket_name("a_b")  # made safe, then told apart by a hash
        assert len(socket_name("x" * 500)) < 80

    def test_the_prolog_s_job_directory_wins_then_the_runtime_dir_then_a_private_tmp_one(
        self, sock_dir: Path
    ) -> None:
        env = {"TMPDIR": str(sock_dir), "EERL_JOBS_DIR": str(sock_dir / "jobs")}
        made = default_address("7", env, create=True)
        assert made.path == f"{sock_dir}/eerl-{os.geteuid()}/sidecar-7.sock"
        runtime = sock_dir / "run-user"
        runtime.mkdir(mode=0o700)
        assert default_address("7", {**env, "XDG_RUNTIME_DIR": str(runtime)}, create=True).path == str(
            runtime / "eerl-sidecar-7.sock"
        )
        (sock_dir / "jobs").mkdir(mode=0o755)
        (sock_dir / "jobs" / "7").mkdir(mode=0o700)
        found = default_address("7", {**env, "XDG_RUNTIME_DIR": str(runtime)}, create=False)
        assert found.path == str(sock_dir / "jobs" / "7" / "sidecar.sock")

    def test_a_client_that_finds_no_directory_looks_there_quietly_and_makes_nothing(
        self, sock_dir: Path
    ) -> None:
        address = default_address("7", {"TMPDIR": str(sock_dir)}, create=False)
        assert address.path.endswith("/sidecar-7.sock")
        assert not (sock_dir / f"eerl-{os.geteuid()}").exists()

    def test_a_job_directory_in_a_directory_others_may_write_is_not_trusted(self, sock_dir: Path) -> None:
        jobs = sock_dir / "jobs"
        jobs.mkdir(mode=0o777)
        jobs.chmod(0o777)
        (jobs / "7").mkdir(mode=0o700)
        with pytest.raises(ConfigError, match="only root may write"):
            default_address("7", {"TMPDIR": str(sock_dir), "EERL_JOBS_DIR": str(jobs)}, create=True)

    @pytest.mark.parametrize("problem", ["symlink", "another user's", "group-readable", "a file"])
    def test_a_directory_that_is_not_private_and_ours_is_refused(self, sock_dir: Path, problem: str) -> None:
        path = sock_dir / "d"
        if problem == "symlink":
            (sock_dir / "real").mkdir(mode=0o700)
            path.symlink_to(sock_dir / "real")
        elif problem == "a file":
            path.touch()
        else:
            path.mkdir(mode=0o700)
            if problem == "another user's":
                os.chown(path, NOBODY, NOBODY)
            else:
                path.chmod(0o750)
        with pytest.raises(ConfigError) as caught:
            check_private_dir(path, what="the sidecar's directory")
        assert str(path) in str(caught.value)


class TestSecret:
    def test_a_bearer_header_matches_only_the_exact_token(self) -> None:
        token = new_token()
        assert len(token) >= 43
        assert token_matches(f"Bearer {token}", token)
        assert token_matches(f"bearer  {token} ", token)
        for header in (
            None,
            "",
            token,
            f"Basic {token}",
            f"Bearer {token}x",
            f"Bearer {token[:-1]}",
            "Bearer é",
        ):
            assert not token_matches(header, token)

    def test_a_token_file_is_written_0600_read_back_and_never_written_through_a_symlink(
        self, sock_dir: Path
    ) -> None:
        path = sock_dir / "token"
        write_token_file(str(path), "abc")
        assert (path.stat().st_mode & 0o777, read_token_file(str(path))) == (0o600, "abc")
        write_token_file(str(path), "def")  # ours: replaced
        assert read_token_file(str(path)) == "def"
        target = sock_dir / "target"
        target.write_text("keep")
        link = sock_dir / "link"
        link.symlink_to(target)
        with pytest.raises(ConfigError, match="not a regular file"):
            write_token_file(str(link), "x")
        assert target.read_text() == "keep"
        os.chown(path, NOBODY, NOBODY)
        with pytest.raises(ConfigError, match="belongs to uid"):
            write_token_file(str(path), "x")

    @pytest.mark.parametrize("content", [b"", b"a b\n", b"x" * 600, b"\x00\x01"])
    def test_a_token_file_that_holds_no_token_is_an_error(self, sock_dir: Path, content: bytes) -> None:
        path = sock_dir / "token"
        path.write_bytes(content)
        with pytest.raises(ConfigError, match="EERL_SIDECAR_TOKEN_FILE"):
            token_from_env({"EERL_SIDECAR_TOKEN_FILE": str(path)})

    def test_the_environment_s_token_wins_over_its_file(self, sock_dir: Path) -> None:
        assert token_from_env({"EERL_SIDECAR_TOKEN": "t", "EERL_SIDECAR_TOKEN_FILE": "/none"}) == "t"
        assert token_from_env({}) is None
        with pytest.raises(ConfigError, match="cannot read"):
            token_from_env({"EERL_SIDECAR_TOKEN_FILE": str(sock_dir / "none")})


class TestRequestHead:
    def test_a_request_head_is_parsed(self) -> None:
        head = parse_head(
            b"POST /v1/phases/begin?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-A: 1\r\nx-a: 2"
        )
        assert (head.method, head.path, head.version) == ("POST", "/v1/phases/begin", "HTTP/1.1")
        assert head.headers == {"host": "a", "content-length": "12", "x-a": "1, 2"}
        assert body_length(head) == 12
        assert head.keep_alive
        assert not parse_head(b"GET / HTTP/1.0").keep_alive
        assert parse_head(b"GET / HTTP/1.0\r\nConnection: keep-alive").keep_alive
        assert not parse_head(b"GET / HTTP/1.1\r\nConnection: close").keep_alive

    @pytest.mark.parametrize(
        ("raw", "status"),
        [
            (b"GET /", 400),
            (b"GET / HTTP/2.0", 505),
            (b"GET / NOT-HTTP", 400),
            (b"G\xc3T / HTTP/1.1", 400),
            (b"GET x HTTP/1.1", 400),
            (b"GET / HTTP/1.1\r\n folded", 400),
            (b"GET / HTTP/1.1\r\nNo colon", 400),
            (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2", 400),
            (b"GET / HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(65)), 431),
        ],
    )
    def test_a_bad_head_is_refused_with_its_status(self, raw: bytes, status: int) -> None:
        with pytest.raises(HttpError) as caught:
            parse_head(raw)
        assert caught.value.status == status

    @pytest.mark.parametrize(
        ("headers", "status"),
        [
            ({"transfer-encoding": "chunked"}, 411),
            ({}, 411),
            ({"content-length": "-1"}, 400),
            ({"content-length": "1e3"}, 400),
            ({"content-length": "16385"}, 413),
        ],
    )
    def test_a_post_body_needs_a_plain_bounded_length(self, headers: dict[str, str], status: int) -> None:
        with pytest.raises(HttpError) as caught:
            body_length(Head("POST", "/", "HTTP/1.1", headers))
        assert caught.value.status == status
        assert caught.value.message.startswith("body:")

    def test_an_answer_is_one_json_line_with_its_length(self) -> None:
        data = response_bytes(401, {"error": "x"}, close=True)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
        assert b"WWW-Authenticate: Bearer" in head
        assert b"Connection: close" in head
        assert b"Content-Length: %d" % len(body) in head
        assert body == b'{"error":"x"}\n'
