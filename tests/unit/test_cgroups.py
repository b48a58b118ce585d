"""The cgroup reader on fake /proc and cgroup trees: v1 and v2, as a container sees them and as a
process on a plain host does."""

from __future__ import annotations

from pathlib import Path

import pytest

from smtriton.serve.host import cgroups

V1_LIMIT_NONE = "9223372036854771712"


def fake_proc(root: Path, cgroup: str, mountinfo: list[str], meminfo_kib: int = 16 << 20) -> Path:
    proc = root / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text("\n".join(mountinfo) + "\n")
    (proc / "meminfo").write_text(f"MemTotal: {meminfo_kib * 2} kB\nMemAvailable: {meminfo_kib} kB\n")
    return proc


def write(directory: Path, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("__", ".")).write_text(text + "\n")
    return directory


def v1_mounts(root: Path, mount_root: str) -> list[str]:
    """Docker's cgroup v1 mounts: one hierarchy per controller, the container's cgroup at their root."""
    return [
        f"31 23 0:28 / {root}/sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755",
        f"32 31 0:29 {mount_root} {root}/sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct",
        f"35 31 0:32 {mount_root} {root}/sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory",
        f"36 31 0:33 {mount_root} {root}/sys/fs/cgroup/pids ro,nosuid - cgroup cgroup rw,pids",
    ]


def test_v1_in_a_container_reads_the_containers_cgroup_at_the_mount_root(tmp_path):
    container = "/docker/0123abcd"
    proc = fake_proc(
        tmp_path,
        f"12:pids:{container}\n4:memory:{container}\n3:cpu,cpuacct:{container}\n0::/system.slice/containerd.service\n",
        v1_mounts(tmp_path, container),
    )
    memory_dir = write(
        tmp_path / "sys/fs/cgroup/memory",
        memory__limit_in_bytes=str(2 << 30),
        memory__usage_in_bytes=str(700 << 20),
        memory__stat=f"cache 300\ntotal_inactive_file {200 << 20}\nhierarchical_memory_limit {4 << 30}",
        memory__oom_control="oom_kill_disable 0\nunder_oom 0\noom_kill 2",
    )
    write(tmp_path / "sys/fs/cgroup/cpu,cpuacct", cpu__cfs_quota_us="300000", cpu__cfs_period_us="100000")

    memory = cgroups.memory_group(proc)
    assert memory is not None
    assert (memory.directory, memory.version) == (memory_dir, 1)
    assert memory.limit() == 2 << 30  # the tighter of its own and the hierarchy's
    assert memory.working_set() == 500 << 20  # usage less the inactive page cache
    assert memory.oom_kills() == 2
    cpu = cgroups.cpu_group(proc)
    assert cpu is not None
    assert cpu.quota() == 3.0
    assert cgroups.available_memory(memory, proc) == (2 << 30) - (500 << 20)  # below the host's 16 GiB
    counter = cgroups.oom_counter(memory)
    assert counter is not None
    assert counter.read() == 2
    (memory_dir / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert counter.read() == 5  # read again, from the same open file
    counter.close()


def test_v1_on_a_host_finds_the_nested_cgroup_and_the_limit_of_a_parent(tmp_path):
    nested = "/process_api/bb6260d0"
    proc = fake_proc(tmp_path, f"4:memory:{nested}\n1:cpu:/\n0::/\n", v1_mounts(tmp_path, "/"))
    memory_dir = write(
        tmp_path / "sys/fs/cgroup/memory/process_api/bb6260d0",
        memory__limit_in_bytes=V1_LIMIT_NONE,  # no limit of its own...
        memory__usage_in_bytes=str(100 << 20),
        memory__stat=f"total_inactive_file 0\nhierarchical_memory_limit {1 << 30}",  # ...but its parent's
        memory__oom_control="oom_kill_disable 0\nunder_oom 0",  # a kernel that does not count kills
    )
    write(tmp_path / "sys/fs/cgroup/cpu,cpuacct", cpu__cfs_quota_us="-1", cpu__cfs_period_us="100000")

    memory = cgroups.memory_group(proc)
    assert memory is not None
    assert memory.directory == memory_dir
    assert memory.limit() == 1 << 30
    assert memory.oom_kills() is None
    assert cgroups.oom_counter(memory) is None
    cpu = cgroups.cpu_group(proc)
    assert cpu is not None
    assert cpu.quota() is None  # -1: no quota


def test_v1_without_any_limit_is_no_limit_and_the_host_decides(tmp_path):
    proc = fake_proc(tmp_path, "4:memory:/\n", v1_mounts(tmp_path, "/"), meminfo_kib=8 << 20)
    write(
        tmp_path / "sys/fs/cgroup/memory",
        memory__limit_in_bytes=V1_LIMIT_NONE,
        memory__usage_in_bytes=str(1 << 30),
        memory__stat=f"hierarchical_memory_limit {V1_LIMIT_NONE}",
    )
    memory = cgroups.memory_group(proc)
    assert memory is not None
    assert memory.limit() is None
    assert cgroups.available_memory(memory, proc) == 8 << 30  # MemAvailable


V2_CONTAINER_MOUNT = "/sys/fs/cgroup"


def test_v2_in_a_container_with_a_cgroup_namespace_reads_the_mount_itself(tmp_path):
    proc = fake_proc(
        tmp_path,
        "0::/\n",
        [f"30 23 0:26 / {tmp_path}{V2_CONTAINER_MOUNT} ro,nosuid - cgroup2 cgroup2 rw,nsdelegate"],
    )
    top = write(
        tmp_path / "sys/fs/cgroup",
        cgroup__controllers="cpuset cpu io memory pids",
        memory__max=str(3 << 30),
        memory__current=str(1 << 30),
        memory__stat=f"anon 100\ninactive_file {256 << 20}",
        memory__events="low 0\nhigh 0\nmax 4\noom 1\noom_kill 1",
        cpu__max="150000 100000",
    )
    memory = cgroups.memory_group(proc)
    assert memory is not None
    assert (memory.directory, memory.version) == (top, 2)
    assert memory.limit() == 3 << 30
    assert memory.working_set() == (1 << 30) - (256 << 20)
    assert memory.oom_kills() == 1
    cpu = cgroups.cpu_group(proc)
    assert cpu is not None
    assert cpu.quota() == 1.5


def test_v2_on_a_host_walks_up_to_the_tightest_ancestor(tmp_path):
    path = "/user.slice/user-1000.slice/session-3.scope"
    proc = fake_proc(tmp_path, f"0::{path}\n", [f"30 23 0:26 / {tmp_path}/sys/fs/cgroup rw - cgroup2 cgroup2 rw"])
    root = write(tmp_path / "sys/fs/cgroup", cgroup__controllers="cpu memory", memory__max="5")  # not the cgroup's
    write(root / "user.slice", cgroup__controllers="cpu memory", memory__max=str(6 << 30))
    write(root / "user.slice/user-1000.slice", cgroup__controllers="cpu memory", memory__max="max")
    scope = write(
        root / "user.slice/user-1000.slice/session-3.scope",
        cgroup__controllers="cpu memory",
        memory__max="max",
        memory__current=str(64 << 20),
        memory__events="oom_kill 0",
        cpu__max="max 100000",
    )
    memory = cgroups.memory_group(proc)
    assert memory is not None
    assert memory.directory == scope
    assert memory.limit() == 5  # the root's file counts too: the walk stops at the mount, inclusive
    cpu = cgroups.cpu_group(proc)
    assert cpu is not None
    assert cpu.quota() is None


def test_a_hybrid_host_uses_the_v1_hierarchy_of_a_controller(tmp_path):
    proc = fake_proc(
        tmp_path,
        "4:memory:/\n0::/\n",
        [*v1_mounts(tmp_path, "/"), f"41 31 0:38 / {tmp_path}/sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw"],
    )
    write(tmp_path / "sys/fs/cgroup/memory", memory__limit_in_bytes=str(1 << 30))
    write(tmp_path / "sys/fs/cgroup/unified", cgroup__controllers="")
    memory = cgroups.memory_group(proc)
    assert memory is not None
    assert memory.version == 1
    assert memory.limit() == 1 << 30


@pytest.mark.parametrize(
    ("cgroup", "mountinfo"),
    [("", []), ("garbage without colons\n", ["not a mountinfo line"]), ("4:memory:/x\n", [])],
)
def test_no_cgroup_found_is_no_limit_and_no_count(tmp_path, cgroup, mountinfo):
    proc = fake_proc(tmp_path, cgroup, mountinfo)
    assert cgroups.memory_group(proc) is None
    assert cgroups.cpu_group(proc) is None
    assert cgroups.available_memory(None, proc) == 16 << 30
    assert cgroups.oom_counter(None) is None
    assert cgroups.describe(None, None) == "memory: no cgroup found; CPU: no cgroup found"


def test_mount_points_with_spaces_are_unescaped(tmp_path):
    base = tmp_path / "with space"
    proc = fake_proc(
        tmp_path,
        "4:memory:/\n",
        [f"35 31 0:32 / {str(base).replace(' ', chr(92) + '040')} rw - cgroup cgroup rw,memory"],
    )
    write(base, memory__limit_in_bytes=str(1 << 20))
    memory = cgroups.memory_group(proc)
    assert memory is not None
    assert memory.limit() == 1 << 20


def test_the_start_up_line_says_where_the_limits_come_from(tmp_path):
    proc = fake_proc(tmp_path, "4:memory:/\n3:cpu,cpuacct:/\n", v1_mounts(tmp_path, "/"))
    write(tmp_path / "sys/fs/cgroup/memory", memory__limit_in_bytes=str(2 << 30), memory__oom_control="oom_kill 0")
    write(tmp_path / "sys/fs/cgroup/cpu,cpuacct", cpu__cfs_quota_us="200000", cpu__cfs_period_us="100000")
    line = cgroups.describe(cgroups.memory_group(proc), cgroups.cpu_group(proc))
    assert line == (
        f"memory: 2048 MiB (cgroup v1 {tmp_path}/sys/fs/cgroup/memory; OOM kills counted); "
        f"CPU: 2 CPUs (cgroup v1 {tmp_path}/sys/fs/cgroup/cpu,cpuacct)"
    )
