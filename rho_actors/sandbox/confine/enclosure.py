"""The host's side of one confined child (internal; DESIGN §5 "Confinement").

An :class:`Enclosure` is made before the child starts and owns what confines it from
outside: its own uid, leased from the policy's range (:mod:`rho_actors.sandbox.confine.uids`),
its private temporary folder (``0700``, owned by that uid), its cgroup
(memory and process bounds for the whole tree) or, when no cgroup can be made, an
:class:`~rho_actors.sandbox.confine.trees.RssSampler`; it builds the child's
:class:`~rho_actors.sandbox.child.ChildSetup` (scrubbed environment, Landlock paths),
kills the child's whole tree, says whether the memory bound was hit, and removes it all
when the child is gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

import psutil
from loguru import logger

from rho_actors.otp.pidfds import PidFd
from rho_actors.sandbox.child import ChildSetup
from rho_actors.sandbox.confine.cgroups import Cgroup, CgroupError
from rho_actors.sandbox.confine.code_paths import split_sys_path
from rho_actors.sandbox.confine.confinement import (
    DEFAULT_UID,
    Confinement,
    available,
    make_private_dir,
    probe,
    python_read_paths,
    warn_if_unconfined,
)
from rho_actors.sandbox.confine.trees import RssSampler, kill_tree
from rho_actors.sandbox.confine.uids import UidLease, lease, runs_process
from rho_actors.sandbox.sweep import remove_tree

__all__ = [
    "ENV_ALLOWLIST", "TREE_ONLY", "UNCONFINED", "ConfinePolicy", "Enclosure", "default_policy", "policy_stats",
    "scrubbed_env", "system_policy",
]

ENV_ALLOWLIST: Final = ("PATH", "LANG", "TZ")
"""Host variables a confined child keeps (plus every ``LC_*``); ``HOME`` and ``TMPDIR``
are its private folder; the rest is what the host passes per tool (``env=``)."""

_names = itertools.count(1)
_GONE_WAIT_S: Final = 600.0
"""How long a removed child's uid waits for its tree's last process to be reaped (seconds)."""


def scrubbed_env(extra: Mapping[str, str] | None = None, private_dir: str | None = None) -> dict[str, str]:
    """The environment of a confined child: the allowlisted host variables, ``HOME``
    and ``TMPDIR`` set to ``private_dir``, then ``extra`` (the host's explicit choice)."""
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWLIST or k.startswith("LC_")}
    if private_dir is not None:
        env.update(HOME=private_dir, TMPDIR=private_dir)
    env.update(extra or {})
    return env


@dataclass(frozen=True, slots=True)
class ConfinePolicy:
    """How a system confines its untrusted children: ``base`` is the
    :class:`~rho_actors.sandbox.confine.confinement.Confinement` each starts from (its uid/gid, limits,
    ``landlock``), ``confine=False`` turns confinement off (children then only get a
    scrubbed environment), ``pids_max`` bounds each child's whole tree (processes;
    ``None``: no bound), ``exclude`` are folders never readable (``data_dir``).

    ``tree_only=True`` is the policy of trusted ``process`` tools (:data:`TREE_ONLY`):
    only the process tree is contained (its own session, a subreaper, a parent-death
    signal, the whole tree in a cgroup bounded to the heap bound, or an RSS sampler, and
    killed as one); the child keeps the host's uid, environment, files and working
    directory, and ``base`` is not used. ``missing``: one sentence per mechanism ``base``
    asked for that this host lacks (see :func:`rho_actors.sandbox.confine.confinement.available`)."""

    base: Confinement = field(default_factory=Confinement)
    confine: bool = True
    pids_max: int | None = 64
    exclude: tuple[str, ...] = ()
    tree_only: bool = False
    missing: tuple[str, ...] = ()


_TREE = Confinement(
    uid=None, gid=None, no_new_privs=False, landlock=False, nproc=None, nofile=None, fsize=None, host_tracker=True,
    namespaces=False, disk_bytes=None, seccomp=False,
)


TREE_ONLY: Final = ConfinePolicy(pids_max=None, tree_only=True)
"""The policy of trusted ``process`` workers: their process tree contained, nothing else."""

UNCONFINED: Final = ConfinePolicy(confine=False)
"""The explicit opt-in to run untrusted code without OS confinement (``confine=`` of
:func:`~rho_actors.sandbox.plugins.discover_plugin`, :func:`rho_actors.selftest.load_tools`
and :func:`rho_actors.run_selftests`; ``--unconfined`` on the command line): the child
still starts clean, with an allowlisted environment, a private folder and a heap bound,
but keeps the host's uid and has no Landlock, no cgroup."""


def default_policy() -> ConfinePolicy:
    """The policy untrusted input gets when no system's is given (the command line,
    :func:`rho_actors.run_selftests`, :func:`rho_actors.selftest.load_tools`): what an
    :class:`rho_actors.ActorSystem` built with default arguments uses (drop to
    a uid of its own, Landlock, rlimits, namespaces, seccomp, a cgroup per child)."""
    return system_policy(None)


def system_policy(
    confinement: Confinement | bool | None, exclude: tuple[str, ...] = (), process_heap_bytes: int = 0
) -> ConfinePolicy:
    """A system's policy from ``ActorSystem(confinement=...)``: ``None`` or ``True``, the
    default :class:`Confinement` (when root: each child a uid of its own, else ``nobody``);
    ``False``, none; else the one given. Mechanisms this host lacks are turned off, each
    said (:func:`rho_actors.sandbox.confine.confinement.available`); ``exclude``: folders never readable
    (``data_dir``). Raises ``ValueError`` for a ``process_heap_bytes`` (bytes; 0: none)
    that is not an int >= 0, and for ``Confinement(address_space=...)``, which is not how
    a system bounds memory (the message names the settings that are)."""
    if type(process_heap_bytes) is not int or process_heap_bytes < 0:
        raise ValueError(f"process_heap_bytes must be an int of 0 or more (bytes; 0: none), got {process_heap_bytes!r}")
    if isinstance(confinement, Confinement) and confinement.address_space != Confinement().address_space:
        raise ValueError(
            "Confinement(address_space=...) is not how a system bounds memory: an untrusted tool's whole tree is "
            "bounded by UntrustedReads(heap_bytes=...), a trusted process tool's by "
            "ActorSystem(process_heap_bytes=...)"
        )
    if confinement is None or confinement is True:
        from rho_actors.sandbox.confine.confinement import default_identity

        uid, gid = default_identity()
        confinement = Confinement(uid=uid, gid=gid)
    base, missing = available(confinement or Confinement())
    policy = ConfinePolicy(base, confine=confinement is not False, exclude=exclude,
                           missing=missing if confinement is not False else ())
    if policy.confine:
        warn_if_unconfined()
    return policy


def policy_stats(policy: ConfinePolicy) -> dict[str, Any]:
    """``stats()["confinement"]`` of a system with ``policy``: the probe's findings, the
    ``active`` mechanisms, the ``missing`` ones, ``network``, ``disk_bytes`` (bytes),
    ``memory_bound``, the ``uid`` every child drops to (``None``: none, or each its own
    from ``uid_range``, ``"FIRST-LAST"``) and what trusted process tools get."""
    base = policy.base
    uid = base.uid if base.uid is not None else DEFAULT_UID
    found = probe(uid, base.gid if base.gid is not None else uid)
    info: dict[str, Any] = found.as_dict()
    active = ["environment", "private_dir"]
    if policy.confine:
        active += ["pdeathsig", "subreaper", "rlimits", "no_new_privs", "worker_cap"]
        if found.identity is None and base.uid is not None:
            active.append("identity")
        if found.landlock is None and base.landlock:
            active.append("landlock")
        if found.cgroup is None:
            active.append("cgroup")
        if base.namespaces:
            active += ["pid_namespace"] * base.pid_namespace + ["ipc_namespace", "mount_namespace"]
            active += [] if base.network else ["network_namespace"]
            if base.disk_bytes is not None:
                active.append("disk_bound")
        if base.seccomp:
            active.append("seccomp")
    memory = "cgroup" if found.cgroup is None else "sampler"
    info["active"] = active
    info["missing"] = list(policy.missing)
    info["network"] = not policy.confine or not base.namespaces or base.network
    info["disk_bytes"] = base.disk_bytes if policy.confine and base.namespaces else None
    info["memory_bound"] = memory if policy.confine else "none"
    own = policy.confine and found.identity is None and base.uid_range is not None and base.uid is not None
    info["uid"] = base.uid if policy.confine and found.identity is None and not own else None
    info["uid_range"] = str(base.uid_range) if own else None
    info["trusted_process"] = (  # trusted process tools: the tree contained, nothing else
        {"tree_kill": True, "memory_bound": memory} if policy.confine
        else {"tree_kill": False, "memory_bound": "rlimit_as"}
    )
    return info


IDLE_WATCH_S: Final = 1.0
"""How often the cgroup of an idle worker is looked at for an OOM kill (seconds; every
50 ms while it runs calls or starts, the first look within 50 ms of a call's start)."""


class _CgroupWatch(RssSampler):
    """Kills the whole tree as soon as the cgroup records an OOM kill (cgroup v1 kills
    one process only; v2 with ``memory.oom.group`` kills them all): every 50 ms while
    the worker starts or runs calls (a call started since the last look counts, so a
    call that began and ended between two looks is looked after too), every
    :data:`IDLE_WATCH_S` while it is idle (:meth:`pace`). A call's start wakes the
    watch only when it rests in its idle wait, and then only to look 50 ms later:
    calls coming back to back never wake it (a wake and a look a call cost the host's
    thread a GIL hand-off; benchmarks/PROFILE.md §32). So an OOM kill is acted on within
    50 ms (plus the look), during a call or just after it. The kernel bounds the tree's
    memory either way; the watch only ends what an OOM kill left, and 20 looks a second
    cost the host 2.4 ms of CPU a second for each idle worker kept (benchmarks/PROFILE.md
    §28)."""

    def __init__(self, pid: int, enclosure: Enclosure) -> None:
        super().__init__(pid, 0, interval_s=0.05)
        self._enclosure = enclosure
        self._idle = False
        self._started = False  # a call started since the last look
        self._resting = False  # in its idle wait: a call's start shortens it
        self._wake = threading.Event()

    def pace(self, busy: bool) -> None:
        """The worker runs a call (``busy``: looked at within 50 ms, then every 50 ms) or is idle."""
        self._idle = not busy
        if busy:
            self._started = True
            if self._resting:  # read after the writes above: the watch reads them after it sets this
                self._resting = False
                self._wake.set()

    def _run(self) -> None:
        wait = self.interval_s
        while not self._stop.is_set():
            if self._wake.wait(wait):  # a call started while it rested: its look 50 ms from now
                self._wake.clear()
                wait = self.interval_s
                continue
            if self._stop.is_set() or self._look():
                return
            wait = self.interval_s if self._busy_since_look() else IDLE_WATCH_S

    def _busy_since_look(self) -> bool:
        """Whether the worker ran a call (or started) since the last look; if not, the
        watch rests, unless a call starts as it decides (then it does not)."""
        started, self._started = self._started, False
        if started or not self._idle:
            return True
        self._resting = True
        if self._started or not self._idle:  # pace() read _resting before it was set
            self._resting = False
            return True
        return False

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        super().stop()

    def check(self) -> bool:
        if not self._enclosure.memory_bound_hit():
            return False
        self.exceeded.set()
        self._enclosure.kill()
        return True


class Enclosure:
    """One confined child's host-side resources (see the module doc). ``heap_bytes``
    bounds the child's whole tree (bytes); ``env`` is added to its scrubbed environment;
    ``modules`` are the tool's code folders it may read and import. With a
    ``tree_only`` policy there is no private folder and no scrubbed environment: only the
    cgroup (or sampler) and the tree kill."""

    def __init__(
        self, policy: ConfinePolicy, heap_bytes: int | None, *, env: Mapping[str, str] | None = None,
        modules: tuple[str, ...] = (),
    ) -> None:
        self.policy = policy
        self.heap_bytes = heap_bytes
        base = policy.base
        self.private_dir: str | None = None
        self.cgroup: Cgroup | None = None
        self.sampler: RssSampler | None = None
        self.cgroup_reason: str | None = None
        self.pid: int | None = None
        self.process: PidFd | None = None  # its pidfd once started(): that process, never one given its pid later
        self.uid_lease: UidLease | None = None
        self._waiting = False  # a thread waits for the tree's last process to be reaped
        self._waiting_lock = threading.Lock()
        uids = base.uid_range if base.uid is not None else None  # uid=None: the host's uid
        if policy.confine and not policy.tree_only and uids is not None and os.geteuid() == 0:
            self.uid_lease = lease(uids)  # raises UidRangeExhausted: the child is refused
            base = replace(base, uid=self.uid_lease.uid, gid=self.uid_lease.uid)
        try:
            self._make(policy, base, heap_bytes, env, modules)
        except BaseException:
            self.remove()
            raise

    def _make(
        self, policy: ConfinePolicy, base: Confinement, heap_bytes: int | None, env: Mapping[str, str] | None,
        modules: tuple[str, ...],
    ) -> None:
        if not policy.tree_only:
            self.private_dir = make_private_dir(base.uid, base.gid) if policy.confine else make_private_dir(None, None)
        if policy.confine:
            try:
                self.cgroup = Cgroup(f"w{next(_names)}", memory_max=heap_bytes, pids_max=policy.pids_max)
            except CgroupError as exc:
                self.cgroup_reason = exc.strerror
        spec = None
        if policy.tree_only:
            spec = replace(  # a cgroup bounds resident memory: no address-space bound then
                _TREE, address_space=heap_bytes or None if self.cgroup is None else None,
                cgroup_procs=self.cgroup.procs_files if self.cgroup is not None else (),
            )
            # the host's environment as it is now (a fork server keeps the one it started with)
            self.setup = ChildSetup(heap_bytes, confinement=spec, env=dict(os.environ))
            return
        if policy.confine:
            split = split_sys_path(policy.exclude)
            spec = replace(
                # what this host lacks is off, and was logged; looked up with the policy's uid (what a
                # host offers does not depend on the uid, and probe() is computed once per uid)
                replace(available(policy.base)[0], uid=base.uid, gid=base.gid),
                # RLIMIT_NPROC counts every process of the uid: with a uid shared by every
                # worker, a tool at it would starve the others. A cgroup bounds this tree alone.
                nproc=base.nproc if self.cgroup is None or policy.pids_max is None else None,
                read_only=python_read_paths(modules=modules, exclude=policy.exclude, split=split),
                list_only=split[1],
                private_dir=self.private_dir,
                # the cgroup bounds the whole tree's resident memory; RLIMIT_AS only without one
                # (it counts what a library maps and never touches: 1 GiB reserved fails every call)
                address_space=heap_bytes or None if self.cgroup is None else None,
                cgroup_procs=self.cgroup.procs_files if self.cgroup is not None else (),
            )
        self.setup = ChildSetup(
            heap_bytes, confinement=spec, env=scrubbed_env(env, self.private_dir),
            workdir=None if policy.confine else self.private_dir, import_dirs=modules, clean=True,
        )

    @property
    def memory_bound(self) -> str:
        """Which memory bound holds the tree: ``"cgroup"``, ``"sampler"`` or ``"none"``."""
        if not self.policy.confine or not self.heap_bytes:
            return "none"
        return "cgroup" if self.cgroup is not None else "sampler"

    @property
    def memory_bound_words(self) -> str | None:
        """The tree's memory bound named for a message (``"resident-memory bound (cgroup)"``,
        ``"resident-memory bound (sampled)"``), ``None`` when there is none. The cgroup's
        version is left out, so a message reads the same on every host (the confinement report names it)."""
        if self.memory_bound == "none":
            return None
        return ("resident-memory bound (cgroup)" if self.cgroup is not None
                else "resident-memory bound (sampled)")

    def started(self, pid: int) -> None:
        """The child ``pid`` started: without a cgroup, sample its tree's memory."""
        self.pid = pid
        self.process = PidFd.open(pid)  # a kill after it was reaped never reaches a process given the pid since
        if self.policy.confine and self.heap_bytes:
            self.sampler = (_CgroupWatch(pid, self) if self.cgroup is not None else RssSampler(pid, self.heap_bytes))
            self.sampler.start()

    def pace(self, busy: bool) -> None:
        """The child runs a call (``busy``) or is idle: how often its cgroup is watched
        for an OOM kill (see :data:`IDLE_WATCH_S`); a sampled memory bound keeps its pace."""
        if isinstance(self.sampler, _CgroupWatch):
            self.sampler.pace(busy)

    def kill(self) -> None:
        """SIGKILL the child and every process of its tree (``setsid`` escapes included);
        only while the child is still the process :meth:`started` named (its pidfd says
        so), the child itself through that pidfd: once it was reaped its pid may be
        another process's, never signalled here (its cgroup, when it has one, is killed
        all the same)."""
        process = self.process
        if self.pid is not None and process is not None and not process.reaped():
            with contextlib.suppress(psutil.Error):
                kill_tree(self.pid)
            process.kill()
        if self.cgroup is not None:
            try:
                self.cgroup.kill()
            except CgroupError as exc:
                logger.warning("confinement: {}", exc)

    def memory_bound_hit(self) -> bool:
        """Whether the tree reached its memory bound (the cgroup's OOM record, or the
        sampler killed it)."""
        if self.sampler is not None and self.sampler.exceeded.is_set():
            return True
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                return self.cgroup.memory_bound_hit()
        return False

    def remove(self) -> None:
        """After the child ended: kill what is left, remove the cgroup and the private
        folder, stop the sampler, give the uid back. Idempotent.

        The uid goes back only once no process of the tree is left, a zombie not yet
        reaped or a process still exiting included (the cgroup's ``pids.current``, which
        counts them until they are reaped; without a cgroup, ``/proc``): while one is, a
        thread of its own waits for that, then removes the cgroup and gives the uid back
        (past :data:`_GONE_WAIT_S` the uid stays leased, said in a warning)."""
        if self.sampler is not None:
            self.sampler.stop()
        if self.process is not None:
            self.process.close()
        if self.cgroup is not None:
            try:
                self.cgroup.kill()
            except CgroupError as exc:
                logger.warning("confinement: {}", exc)
        if self.private_dir is not None:
            remove_tree(self.private_dir)  # never raises, however deep the tool nested it
        if self.uid_lease is None or self._tree_gone():
            self._dispose()
            return
        with self._waiting_lock:
            if self._waiting:
                return
            self._waiting = True
        threading.Thread(target=self._dispose_once_gone, name="rho-uid-lease", daemon=True).start()

    def _tree_gone(self) -> bool:
        """Whether no process of the tree is left, not even one not yet reaped."""
        if self.cgroup is not None:
            return self.cgroup.counted() == 0
        return self.uid_lease is None or not runs_process(self.uid_lease.uid)

    def _dispose(self) -> None:
        if self.cgroup is not None:
            try:
                self.cgroup.remove()
            except CgroupError as exc:
                logger.warning("confinement: {}", exc)
        if self.uid_lease is not None:
            self.uid_lease.release()  # its tree is gone: another child may have the uid

    def _dispose_once_gone(self) -> None:
        try:
            self._wait_gone_and_dispose()
        except Exception:  # logged: its thread ends, the uid stays leased (never given to another child early)
            logger.exception("confinement: disposing of uid {} failed; it stays leased",
                             self.uid_lease.uid if self.uid_lease is not None else None)

    def _wait_gone_and_dispose(self) -> None:
        until, pause = time.monotonic() + _GONE_WAIT_S, 0.01
        while not self._tree_gone():
            if time.monotonic() > until:
                logger.warning("confinement: uid {} stays leased: a process of it is still not reaped after {:g} s",
                               self.uid_lease.uid if self.uid_lease is not None else None, _GONE_WAIT_S)
                return
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        self._dispose()
