"""This process's memory and CPU limits, as the kernel's control groups set them: cgroup v1 and v2.

SageMaker's inference hosts run Amazon Linux 2, whose Docker gives a container cgroup v1; newer hosts
and laptops have cgroup v2. The cgroups are found the way the JVM and Go's runtime find them: the
process's own path per controller in ``/proc/self/cgroup``, and where that hierarchy is mounted in
``/proc/self/mountinfo``. Inside a container the mount's root is the container's cgroup (the path in
``/proc/self/cgroup`` equals it, or is ``/`` in a cgroup namespace); on a plain host the path is
nested below the mount point. Limits set on a parent count too (v1's ``hierarchical_memory_limit``,
v2's ancestors). A value meaning "no limit" (v1's huge ``limit_in_bytes``, v2's ``max``) is None.

The multi-model memory check (how much a load may use), the out-of-memory verdict (did the OOM killer
strike during a request) and the default worker count (the CPU quota) read these; nothing else does.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("serve")

PROC = Path("/proc")
# v1 reports "no limit" as the largest page-aligned counter (9223372036854771712); anything this
# large is no limit a machine could have.
UNLIMITED = 1 << 60


@dataclass(frozen=True)
class Mount:
    root: str  # the cgroup path at the mount's root
    point: Path  # where it is mounted
    version: int  # 1 or 2


def _hierarchies(proc: Path) -> dict[str, str]:
    """Controller ("memory", "cpu"; "" for the v2 unified hierarchy) -> this process's cgroup path."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in (proc / "self" / "cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            _, controllers, path = parts
            for controller in controllers.split(",") if controllers else [""]:
                paths.setdefault(controller, path)
    return paths


def _mounts(proc: Path) -> list[tuple[Mount, set[str]]]:
    """Each cgroup mount and the controllers it carries (v1: its super options; v2: none listed)."""
    found = []
    with contextlib.suppress(OSError):
        for line in (proc / "self" / "mountinfo").read_text().splitlines():
            fields = line.split()
            if "-" not in fields:
                continue
            dash = fields.index("-")
            if len(fields) < dash + 4 or dash < 5:
                continue
            fstype, options = fields[dash + 1], fields[dash + 3]
            root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
            if fstype == "cgroup":
                found.append((Mount(root, point, 1), set(options.split(","))))
            elif fstype == "cgroup2":
                found.append((Mount(root, point, 2), set()))
    return found


def _unescape(field: str) -> str:
    """mountinfo writes spaces, tabs, newlines and backslashes in paths as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _directory(mount: Mount, path: str) -> Path:
    """Where the cgroup ``path`` lies under ``mount``: nested on a host, the mount itself in a
    container (its root is the container's cgroup)."""
    if path == mount.root:
        return mount.point
    if mount.root == "/":
        return mount.point / path.lstrip("/")
    if path.startswith(mount.root.rstrip("/") + "/"):
        return mount.point / path[len(mount.root.rstrip("/")) + 1 :]
    return mount.point  # a cgroup namespace shows another path than the mount's root: the mount is ours


def locate(controller: str, proc: Path = PROC) -> tuple[Path, Mount] | None:
    """This process's cgroup directory for ``controller`` and the mount it lies under, or None (no cgroup)."""
    paths = _hierarchies(proc)
    mounts = _mounts(proc)
    if controller in paths:
        for mount, options in mounts:
            if mount.version == 1 and controller in options:
                directory = _directory(mount, paths[controller])
                if directory.is_dir():
                    return directory, mount
    if "" in paths:
        for mount, _ in mounts:
            if mount.version == 2:
                directory = _directory(mount, paths[""])
                if controller in _read(directory / "cgroup.controllers").split() or _v2_files(directory, controller):
                    return directory, mount
    return None


def _v2_files(directory: Path, controller: str) -> bool:
    """Whether a v2 cgroup has ``controller``'s files (the root cgroup lists no controllers of its own)."""
    return (directory / ("memory.current" if controller == "memory" else "cpu.max")).is_file()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _number(text: str) -> int | None:
    """An integer file's value; None when unset, "max" or "no limit"."""
    text = text.strip()
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value < 0 or value >= UNLIMITED else value


def _keyed(text: str, key: str) -> int | None:
    """The value of ``key`` in a file of ``key value`` lines (memory.stat, memory.events, oom_control)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return None


class MemoryGroup:
    """The memory cgroup of this process: its limit, what it uses, and the OOM killer's count."""

    def __init__(self, directory: Path, version: int, mount_point: Path | None = None) -> None:
        self.directory = directory
        self.version = version
        self._top = mount_point or directory

    def limit(self) -> int | None:
        """Bytes this cgroup and its ancestors allow, the tightest of them (None: no limit)."""
        if self.version == 1:
            own = _number(_read(self.directory / "memory.limit_in_bytes"))
            inherited = _number(str(_keyed(_read(self.directory / "memory.stat"), "hierarchical_memory_limit") or ""))
            limits = [v for v in (own, inherited) if v is not None]
        else:
            limits = []
            directory = self.directory
            while True:
                value = _number(_read(directory / "memory.max"))
                if value is not None:
                    limits.append(value)
                if directory == self._top or directory.parent == directory:
                    break
                directory = directory.parent
        return min(limits) if limits else None

    def working_set(self) -> int | None:
        """Bytes in use that the kernel cannot simply drop: usage less the inactive page cache (what
        the OOM killer weighs, and what Kubernetes calls the working set)."""
        usage_file, inactive_key = (
            ("memory.usage_in_bytes", "total_inactive_file")
            if self.version == 1
            else ("memory.current", "inactive_file")
        )
        usage = _number(_read(self.directory / usage_file))
        if usage is None:
            return None
        inactive = _keyed(_read(self.directory / "memory.stat"), inactive_key) or 0
        return max(0, usage - inactive)

    @property
    def oom_file(self) -> Path:
        return self.directory / ("memory.oom_control" if self.version == 1 else "memory.events")

    def oom_kills(self) -> int | None:
        """Processes the OOM killer ended in this cgroup so far (None: this kernel does not count)."""
        return _keyed(_read(self.oom_file), "oom_kill")


class OomCounter:
    """The OOM killer's count, read cheaply and often: the file is kept open and read with one
    ``pread`` (about a microsecond), so a worker can note the count when each invoke begins."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self) -> int | None:
        try:
            return _keyed(os.pread(self._fd, 4096, 0).decode("ascii", "replace"), "oom_kill")
        except OSError:
            return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class CpuGroup:
    """The CPU cgroup of this process: its quota."""

    def __init__(self, directory: Path, version: int) -> None:
        self.directory = directory
        self.version = version

    def quota(self) -> float | None:
        """CPUs' worth of time this cgroup may use per period (None: no quota)."""
        if self.version == 1:
            quota = _number(_read(self.directory / "cpu.cfs_quota_us"))
            period = _number(_read(self.directory / "cpu.cfs_period_us"))
        else:
            fields = _read(self.directory / "cpu.max").split()
            quota = _number(fields[0]) if fields else None
            period = _number(fields[1]) if len(fields) > 1 else None
        if quota is None or not period:
            return None
        return quota / period


def memory_group(proc: Path = PROC) -> MemoryGroup | None:
    found = locate("memory", proc)
    if found is None:
        return None
    directory, mount = found
    return MemoryGroup(directory, mount.version, mount.point if mount.version == 2 else None)


def cpu_group(proc: Path = PROC) -> CpuGroup | None:
    found = locate("cpu", proc)
    if found is None:
        return None
    directory, mount = found
    return CpuGroup(directory, mount.version)


def oom_counter(group: MemoryGroup | None) -> OomCounter | None:
    """A counter of ``group``'s OOM kills for reads on every request (None where it cannot count)."""
    if group is None or group.oom_kills() is None:
        return None
    try:
        return OomCounter(group.oom_file)
    except OSError:
        return None


def host_available_memory(proc: Path = PROC) -> int | None:
    """The kernel's estimate of memory a new workload can use without swapping (MemAvailable)."""
    for line in _read(proc / "meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            with contextlib.suppress(ValueError, IndexError):
                return int(line.split()[1]) * 1024
    return None


def available_memory(group: MemoryGroup | None, proc: Path = PROC) -> int | None:
    """Memory a load may still use: the tighter of the cgroup's room (limit less working set) and the
    host's MemAvailable (None when neither is known)."""
    room = []
    host = host_available_memory(proc)
    if host is not None:
        room.append(host)
    if group is not None:
        limit, used = group.limit(), group.working_set()
        if limit is not None:
            room.append(max(0, limit - (used or 0)))
    return min(room) if room else None


def describe(memory: MemoryGroup | None, cpu: CpuGroup | None) -> str:
    """One line for the start-up log: where the limits come from and what they are."""
    parts = []
    if memory is None:
        parts.append("memory: no cgroup found")
    else:
        limit = memory.limit()
        kills = "counted" if memory.oom_kills() is not None else "not counted by this kernel"
        amount = f"{limit >> 20} MiB" if limit is not None else "no limit"
        parts.append(f"memory: {amount} (cgroup v{memory.version} {memory.directory}; OOM kills {kills})")
    if cpu is None:
        parts.append("CPU: no cgroup found")
    else:
        quota = cpu.quota()
        amount = f"{quota:g} CPUs" if quota is not None else "no quota"
        parts.append(f"CPU: {amount} (cgroup v{cpu.version} {cpu.directory})")
    return "; ".join(parts)


def available_cpus() -> int:
    """CPUs this process may use: its affinity, bounded by its cgroup's CPU quota (a container's
    limit, cgroup v1 or v2)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    group = cpu_group()
    quota = group.quota() if group is not None else None
    if quota is not None:
        count = min(count, max(1, int(quota)))
    return max(1, count)
