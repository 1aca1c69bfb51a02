"""The front door's HAProxy config (pure rendering, checked by the real HAProxy binary)."""

from __future__ import annotations

import os
import subprocess

from hetflow.workloads.serve.front import (
    FrontPlan,
    Server,
    app_prefix,
    backend_name,
    group_prefix,
    haproxy_binary,
    reachable,
    render_config,
    write_error_files,
)

PLAN = FrontPlan(app="svc", host="127.0.0.1", port=18080,
                 models={"digits": ["svc.digits"], "placed": ["svc.placed-d0", "svc.placed-d1"]},
                 gateway_app="svc", request_timeout_s=30, retries=1, max_body_bytes=65536,
                 fallbacks={"digits": ["placed"]})
SERVERS = {"svc.digits": [Server("r1", "127.0.0.1", 30001), Server("r2", "127.0.0.1", 30002)],
           "svc.placed-d0": [Server("p0", "127.0.0.1", 30003)],
           "svc.placed-d1": [Server("p1", "127.0.0.1", 30004)],
           "svc": [Server("gw", "127.0.0.1", 30005)]}


def assert_valid(tmp_path, text: str, env: dict[str, str] | None = None) -> None:
    """The real HAProxy binary accepts the config (``haproxy -c``; ``env``: added to its
    environment, as the front door gives it secrets)."""
    path = tmp_path / "haproxy.cfg"
    path.write_text(text)
    check = subprocess.run([haproxy_binary(), "-c", "-f", str(path)], capture_output=True,
                           text=True, timeout=30, env={**os.environ, **(env or {})})
    assert check.returncode == 0, check.stdout + check.stderr


def _backend(text: str, name: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(f"backend {name}")
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")),
               len(lines))
    return [line.strip() for line in lines[start + 1:end]]


def test_config_is_valid_haproxy(tmp_path) -> None:
    errors = write_error_files(PLAN, str(tmp_path))  # hetflow's JSON errors as HAProxy's own
    for servers in (SERVERS, {}):  # also before any replica is up
        path = tmp_path / "haproxy.cfg"
        path.write_text(render_config(PLAN, servers, str(tmp_path / "admin.sock"), errors))
        check = subprocess.run([haproxy_binary(), "-c", "-f", str(path)],
                               capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr


def test_config_with_keys_and_shedding_is_valid_for_any_model_name(tmp_path) -> None:
    """Model names may hold '-' and '.', which HAProxy variable names may not."""
    from dataclasses import replace

    from hetflow.workloads.serve.access import AccessPlan, map_entries, write_maps

    plan = replace(PLAN, models={"digits-int8.v2": ["svc.d"], "placed": ["svc.placed-d0"]},
                   fallbacks={}, access=AccessPlan(store=str(tmp_path / "keys"), default_model="placed"),
                   queue_limits={"digits-int8.v2": 16, "placed": 4}, route_prefix="/a/b")
    write_maps(str(tmp_path / "maps"), map_entries({}, "salt", {}))
    servers = {"svc.d": [Server("r1", "127.0.0.1", 30001)], "svc": [Server("gw", "127.0.0.1", 30005)]}
    assert_valid(tmp_path, render_config(plan, servers, str(tmp_path / "admin.sock"), None,
                                         str(tmp_path / "maps"), "salt"))


def test_with_keys_every_replica_gateway_and_engine_request_carries_the_token_from_the_environment(tmp_path) -> None:
    """Keys on (``front_token``): each model backend and the gateway's set the token header,
    an LLM engine's backend sends it as the Bearer key; the config names the variable only."""
    from dataclasses import replace

    from hetflow.workloads.serve.access import AccessPlan, map_entries, write_maps
    from hetflow.workloads.serve.upstream import llm_backend, write_lua

    engines = llm_backend("chat", [("p1-r0", "127.0.0.1", 30010, 1)], 30)
    plan = replace(PLAN, access=AccessPlan(store=str(tmp_path / "keys"), default_model=None), front_token=True,
                   upstreams=(engines,))
    write_maps(str(tmp_path / "maps"), map_entries({}, "salt", {}))
    text = render_config(plan, SERVERS, str(tmp_path / "admin.sock"), None, str(tmp_path / "maps"),
                         "salt", write_lua(str(tmp_path)))
    assert_valid(tmp_path, text, {"HETFLOW_FRONT_TOKEN": "t0ken"})
    token = 'http-request set-header x-hetflow-front "${HETFLOW_FRONT_TOKEN}"'
    for backend in [*(f"m_{m}" for m in plan.models), "gateway"]:
        assert token in _backend(text, backend), backend
    chat = _backend(text, "u_chat")
    assert 'http-request set-header Authorization "Bearer ${HETFLOW_FRONT_TOKEN}"' in chat
    assert "http-request del-header Authorization" not in chat
    off = render_config(replace(plan, front_token=False), SERVERS, str(tmp_path / "admin.sock"), None,
                        str(tmp_path / "maps"), "salt", write_lua(str(tmp_path)))
    assert "HETFLOW_FRONT_TOKEN" not in off and "http-request del-header Authorization" in _backend(off, "u_chat")


def test_every_model_backend_has_the_gateway_as_backup() -> None:
    text = render_config(PLAN, SERVERS, "/tmp/x.sock")
    digits = _backend(text, backend_name("digits"))
    assert "server r1 127.0.0.1:30001" in digits and "server r2 127.0.0.1:30002" in digits
    assert "server gw-gw 127.0.0.1:30005 backup" in digits
    placed = _backend(text, backend_name("placed"))
    assert {"server p0 127.0.0.1:30003", "server p1 127.0.0.1:30004"} <= set(placed)
    assert "retry-on conn-failure empty-response" in text  # a dead replica's request repeated
    # only a model's POSTs take its backend; GETs (metadata, health) go to the gateway
    assert f"use_backend {backend_name('digits')} if is_{backend_name('digits')} METH_POST" in text


def test_without_direct_ingress_each_proxy_is_one_server_per_backend(tmp_path) -> None:
    """Without direct ingress every application lists the same Serve proxy: it must appear once
    as a server of each backend (HAProxy keeps only the last of equal names, which was the
    backup, so the model was never routed) and the config stays valid."""
    proxy = [Server("SERVE_PROXY_ACTOR-n1", "127.0.0.1", 8000)]
    servers = {app: proxy for app in ("svc.digits", "svc.placed-d0", "svc.placed-d1", "svc")}
    text = render_config(PLAN, servers, str(tmp_path / "admin.sock"))
    placed = _backend(text, backend_name("placed"))
    names = [x.split()[1] for x in placed if x.startswith("server ")]
    assert len(names) == len(set(names)) == 2
    assert "server SERVE_PROXY_ACTOR-n1 127.0.0.1:8000" in placed
    assert_valid(tmp_path, text)


def test_rewritten_path_is_accepted_by_every_group_and_the_gateway() -> None:
    """Serve's direct ingress refuses a path outside a replica's route prefix; the path HAProxy
    writes for a model's backend starts with each of the model's prefixes and the gateway's."""
    text = render_config(PLAN, SERVERS, "/tmp/x.sock")
    line = next(x for x in _backend(text, backend_name("placed")) if "set-path" in x)
    written = line.split("set-path ", 1)[1].replace("%[path]", "/v1/models/placed/predict")
    for index in range(2):
        assert written.startswith(group_prefix("svc", "placed", index))
    assert written.startswith(app_prefix("svc"))


def test_route_prefix_is_valid_and_stripped_for_the_handlers(tmp_path) -> None:
    from dataclasses import replace

    plan = replace(PLAN, route_prefix="/svc/api")
    text = render_config(plan, SERVERS, str(tmp_path / "admin.sock"))
    assert "path_beg /svc/api/v1/models/digits/ /svc/api/v2/models/digits/" in text
    assert "regsub(^/svc/api,)" in text
    assert_valid(tmp_path, text)


def test_haproxys_own_errors_are_json_of_one_line(tmp_path) -> None:
    import json

    from hetflow.workloads.serve.front import error_files

    files = error_files(PLAN)
    assert {502, 503, 504} <= set(files)
    for code, content in files.items():
        head, _, body = content.partition(b"\r\n\r\n")
        status, *headers = head.decode().split("\r\n")
        assert status.startswith(f"HTTP/1.1 {code} ")
        fields = dict(h.split(": ", 1) for h in headers)
        assert fields["Content-Type"] == "application/json"
        assert int(fields["Content-Length"]) == len(body)
        message = json.loads(body)["error"]
        assert message and "\n" not in message
    assert "30s" in json.loads(files[504].partition(b"\r\n\r\n")[2])["error"]


# --- where the front door dials a target Serve reports at its node's IP ----------------------
# Serve lists every replica at its node's IP; with a loopback http host the replicas listen on
# loopback only. On a machine whose node IP is its LAN address (192.0.2.2 here) dialling that
# IP failed every health check (`hetflow serve` never became ready).
LAN = "192.0.2.2"


def test_loopback_host_dials_replicas_on_this_node_at_loopback() -> None:
    assert reachable(LAN, 30001, "r1", "127.0.0.1", LAN) == Server("r1", "127.0.0.1", 30001)
    assert reachable(LAN, 30001, "r1", "::1", LAN) == Server("r1", "::1", 30001)
    assert reachable(LAN, 30001, "r1", "localhost", LAN) == Server("r1", "127.0.0.1", 30001)
    # a node IP that is loopback already (Ray in loopback mode) stays reachable
    assert reachable("127.0.0.1", 30001, "r1", "127.0.0.1", "127.0.0.1") == \
        Server("r1", "127.0.0.1", 30001)


def test_loopback_host_leaves_out_replicas_of_other_nodes() -> None:
    # they listen on their own node's loopback: nothing on this node can reach them
    assert reachable("192.0.2.3", 30001, "r1", "127.0.0.1", LAN) is None


def test_other_hosts_dial_the_node_ip() -> None:
    # replicas bind every address of their node then: the node IP reaches them, on any node
    assert reachable("192.0.2.3", 30001, "r1", None, LAN) == Server("r1", "192.0.2.3", 30001)
    assert reachable(LAN, 30002, "r2", None, LAN) == Server("r2", LAN, 30002)


def test_stale_front_door_folders_are_swept_and_live_or_foreign_ones_kept(tmp_path) -> None:
    """A front door killed with SIGKILL (with hetflow serve) leaves its folder of HAProxy
    files; the next front door removes those whose owner process is gone - and only those."""
    import os
    import sys

    from hetflow.workloads.serve.front import claim_dir, sweep_stale_dirs

    (tmp_path / "hetflow-front-a-1").mkdir()  # its owner: a process that has ended
    gone = subprocess.run([sys.executable, "-c", "import sys; from hetflow.workloads.serve.front "
                           "import claim_dir; claim_dir(sys.argv[1])", str(tmp_path / "hetflow-front-a-1")],
                          timeout=60)
    assert gone.returncode == 0 and (tmp_path / "hetflow-front-a-1" / "owner").exists()
    live = tmp_path / "hetflow-front-b-2"
    live.mkdir()
    claim_dir(str(live))  # this process: alive
    reused = tmp_path / "hetflow-front-c-3"  # a PID alive now, but another process (start time)
    reused.mkdir()
    (reused / "owner").write_text(f"{os.getpid()} 1")
    foreign = tmp_path / "hetflow-front-d-4"  # no owner file: not ours to judge
    foreign.mkdir()
    other = tmp_path / "something-else"
    other.mkdir()
    (other / "owner").write_text("1 1")
    removed = sweep_stale_dirs(str(tmp_path))
    assert sorted(removed) == sorted([str(tmp_path / "hetflow-front-a-1"), str(reused)])
    assert live.exists() and foreign.exists() and other.exists()
    assert not (tmp_path / "hetflow-front-a-1").exists() and not reused.exists()


def test_realtime_runs_the_process_under_sched_fifo_or_says_why_not() -> None:
    """``http.realtime``: what HAProxy's process sets before it runs (``_haproxy_setup``) and
    the line the actor logs when the OS refused it (``realtime_problem``): a process started
    with it runs SCHED_FIFO at the priority asked where this machine allows that; one whose
    user may not (uid 65534, no RLIMIT_RTPRIO) runs as usual and the check names what it needs."""
    import functools
    import resource

    from hetflow.workloads.serve.front import _haproxy_setup, realtime_problem

    allowed = subprocess.run(["chrt", "-f", "3", "true"], capture_output=True).returncode == 0
    started = subprocess.Popen(["sleep", "30"], preexec_fn=functools.partial(_haproxy_setup, None, 3))

    def unprivileged() -> None:
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        if os.getuid() == 0:
            os.setgid(65534)
            os.setuid(65534)
        _haproxy_setup(None, 3)

    refused = subprocess.Popen(["sleep", "30"], preexec_fn=unprivileged)
    try:
        got = os.sched_getscheduler(started.pid), os.sched_getparam(started.pid).sched_priority
        assert got == ((os.SCHED_FIFO, 3) if allowed else (os.SCHED_OTHER, 0))
        assert (realtime_problem(started.pid, 3) is None) == allowed
        assert os.sched_getscheduler(refused.pid) == os.SCHED_OTHER
        line = realtime_problem(refused.pid, 3)
        assert line is not None and "\n" not in line
        assert "http.realtime" in line and "RLIMIT_RTPRIO" in line
        assert realtime_problem(refused.pid, None) is None  # nothing asked: nothing to say
        assert realtime_problem(started.pid, 4 if allowed else 3) is not None  # another priority
    finally:
        for proc in (started, refused):
            proc.kill()
            proc.wait()
