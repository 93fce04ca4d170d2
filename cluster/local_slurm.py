"""A real two-node Slurm cluster on this machine, for tests and for trying a launch: plain daemons, no systemd.

    python -m cluster.local_slurm install           # apt-get install slurmctld slurmd slurm-client munge (root)
    python -m cluster.local_slurm up DIR            # munged + slurmctld + one slurmd per node; prints SLURM_CONF
    python -m cluster.local_slurm down DIR          # cancel every job, end every daemon and job process by PID
    export SLURM_CONF=DIR/slurm.conf                # then sbatch / squeue / python -m recipes ... --executor slurm

Everything lives in DIR (its own munge key and socket, configuration, state, spool, logs, PID files); the daemons
listen on 127.0.0.1 only (`CommunicationParameters=NoInAddrAny,NoCtldInAddrAny`, every address 127.0.0.1), on
ports free when the cluster came up, below the kernel's ephemeral range (no outgoing connection takes them first).
The nodes `n1`, `n2` are two `slurmd -N` on this host, each advertising `cpus` CPUs
(`SlurmdParameters=config_overrides`: more than the machine has is allowed). The settings are the ones that run in
a container without systemd or cgroups (linuxproc process tracking, no task plugin, no accounting), with
scheduling every second, a 5 s credential lifetime so a requeued job restarts in seconds, and jobs kept visible to
`scontrol show job` for 10 minutes after they end (there is no accounting database: `sacct` does not work here).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "scancel", "srun")
PARTITION = "local"
INSTALL_HINT = ("install Slurm with `python -m cluster.local_slurm install` (as root: apt-get install "
                + " ".join(PACKAGES) + "), or on another system its Slurm and MUNGE packages")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if not (shutil.which(b) or Path("/usr/sbin", b).exists())]


def install() -> None:
    """Debian's packages; the image's policy-rc.d (or no init system) keeps them from starting as services."""
    if os.geteuid() != 0:
        raise SystemExit("install needs root (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "-o", "Dpkg::Options::=--force-confold"]
    if subprocess.run([*apt, "install", "-y", "-q", *PACKAGES], env=env).returncode != 0:
        subprocess.run([*apt, "update", "-q"], env=env, check=True)
        subprocess.run([*apt, "install", "-y", "-q", *PACKAGES], env=env, check=True)


def _binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/sbin/{name}" if Path("/usr/sbin", name).exists() else None)
    if not found:
        raise RuntimeError(f"{name} not found: {INSTALL_HINT}")
    return found


# The daemons bind their ports themselves, after this process has let them go. A port the kernel handed out
# (bind to port 0) comes from its ephemeral range, which every outgoing connection on the host also draws from (a
# test's torchrun, pip, a process group's store): one of those could take it in between, and slurmctld or slurmd
# would fail to start. Ports below that range are only ever taken by a process that asks for the number itself.
DAEMON_PORTS_FLOOR = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_floor() -> int:
    """The lowest port the kernel hands out on its own (32768 when it does not say)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports below the ephemeral range, each free now (bound once and let go)."""
    ceiling = ephemeral_floor()
    candidates = range(DAEMON_PORTS_FLOOR, ceiling)  # empty when the kernel's range starts lower
    found: list[int] = []
    for port in random.SystemRandom().sample(candidates, min(100 * count, len(candidates))):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # taken now
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise RuntimeError(f"no {count} free ports on 127.0.0.1 between {DAEMON_PORTS_FLOOR} and the kernel's "
                       f"ephemeral range ({ceiling}, {EPHEMERAL_RANGE})")


@dataclass
class LocalSlurm:
    """A cluster whose every file is under `root`."""
    root: Path
    nodes: tuple[str, ...] = ("n1", "n2")
    cpus: int = 4

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, a launcher) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _pidfiles(self) -> list[Path]:
        return [self.root / "munge" / "munged.pid", self.root / "slurmctld.pid",
                *(self.root / f"slurmd-{n}.pid" for n in self.nodes)]

    def write_config(self) -> None:
        munge = self.root / "munge"
        for d in ("state", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        munge.mkdir(mode=0o700, exist_ok=True)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        shutil.chown(munge, "munge", "munge"), shutil.chown(key, "munge", "munge")
        host = socket.gethostname()
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        r = self.root
        lines = [
            f"ClusterName=mlmclm-local", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            # below 5 s Slurm rejects cred_expire; at 5 a requeued job starts again in about 6 s (default: 120 s)
            f"AuthInfo=socket={munge}/munge.socket,cred_expire=5",
            # bind to the configured address, 127.0.0.1, not every interface (slurmd and srun; slurmctld)
            "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log", f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",  # no cgroups or systemd here
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill", "SchedulerParameters=bf_interval=1,sched_interval=1,batch_sched_delay=0",
            "SlurmdParameters=config_overrides",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none", "MpiDefault=none", "SwitchType=switch/none",
            "KillWait=5", "ReturnToService=2", "MinJobAge=600", "InactiveLimit=0", "SlurmdTimeout=30",
        ]
        for name, port in zip(self.nodes, node_ports):
            lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus} "
                         f"State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def up(self, timeout: float = 30) -> None:
        """Start munged, slurmctld and the slurmds (each daemonises itself: none is a child of this process) and
        wait until every node is idle."""
        missing = missing_binaries()
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not found: {INSTALL_HINT}")
        if any(self._alive(p) for p in self._pidfiles()):
            raise RuntimeError(f"a cluster is already running from {self.root}; `down` it first")
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        for parent in self.root.parents:  # munged runs as the munge user: it must reach its folder
            if not parent.stat().st_mode & 0o001:
                raise RuntimeError(f"{parent} is not searchable by other users, so munged (user munge) cannot reach "
                                   f"{self.root}/munge; put the cluster elsewhere (e.g. under /tmp)")
        self.write_config()
        munge = self.root / "munge"
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        try:
            subprocess.run(["runuser", "-u", "munge", "--", _binary("munged"), "--force",
                            f"--socket={munge}/munge.socket", f"--key-file={munge}/munge.key",
                            f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                            f"--seed-file={munge}/munged.seed"], check=True, env=env)
            subprocess.run([_binary("slurmctld"), "-c", "-i", "-f", str(self.conf)], check=True, env=env)
            for name in self.nodes:
                subprocess.run([_binary("slurmd"), "-N", name, "-f", str(self.conf)], check=True, env=env)
            self._wait_idle(timeout)
        except BaseException:
            self.down()
            raise

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                                 env={**os.environ, **self.env})
            states = out.stdout.strip()
            if out.returncode == 0 and len(states.splitlines()) == len(self.nodes) and all(
                    line.split()[1] == "idle" for line in states.splitlines()):
                return
            time.sleep(0.2)
        logs = "\n".join(f"--- {p}\n" + p.read_text(errors="replace")[-1500:]
                         for p in sorted((self.root / "log").glob("*.log")))
        raise RuntimeError(f"local Slurm not idle after {timeout:.0f} s (sinfo: {states!r})\n{logs}")

    def job_processes(self) -> list[int]:
        """Every process of this cluster's jobs: slurmstepd and what it started, found by the cluster's SLURM_CONF
        in their environment or their slurmstepd's spool directory."""
        import psutil

        ours = []
        for proc in psutil.process_iter(["pid", "name", "cmdline"]):
            try:
                if proc.info["name"] == "slurmstepd" or "slurmstepd" in " ".join(proc.info["cmdline"] or [])[:40]:
                    if any(str(self.root) in (f.path or "") for f in proc.open_files()) or \
                            str(self.root) in proc.cwd() or self._env_is_ours(proc):
                        ours.append(proc.pid)
                elif self._env_is_ours(proc):
                    ours.append(proc.pid)
            except psutil.Error:
                continue
        return [pid for pid in ours if pid != os.getpid()]

    def _env_is_ours(self, proc) -> bool:
        try:
            return proc.environ().get("SLURM_CONF") == str(self.conf) and "SLURM_JOB_ID" in proc.environ()
        except Exception:
            return False

    def down(self, timeout: float = 20) -> list[str]:
        """Cancel every job, stop every daemon, end what is left by PID. Returns what had to be killed."""
        import psutil

        env = {**os.environ, **self.env}
        if self.conf.exists() and self._alive(self.root / "slurmctld.pid"):
            subprocess.run(["scancel", "--full", f"--partition={PARTITION}"], env=env, capture_output=True)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%T"], env=env, capture_output=True,
                                     text=True)
                active = {"RUNNING", "COMPLETING", "PENDING", "CONFIGURING"} & set(out.stdout.split())
                if out.returncode != 0 or not active:
                    break
                time.sleep(0.3)
        killed = []
        pids = [self._pid(p) for p in self._pidfiles()[::-1]]  # slurmds, then slurmctld, then munged
        for pid in filter(None, pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        daemons = [psutil.Process(pid) for pid in filter(None, pids) if psutil.pid_exists(pid)]
        _, alive = psutil.wait_procs(daemons, timeout=10)
        for proc in alive + [psutil.Process(pid) for pid in self.job_processes() if psutil.pid_exists(pid)]:
            try:
                killed.append(f"{proc.pid} {' '.join(proc.cmdline())[:80]}")
                proc.kill()
            except psutil.Error:
                pass
        for pidfile in self._pidfiles():
            pidfile.unlink(missing_ok=True)
        return killed

    @staticmethod
    def _pid(pidfile: Path) -> int | None:
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _alive(self, pidfile: Path) -> bool:
        pid = self._pid(pidfile)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.local_slurm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("install", "up", "down", "check"))
    parser.add_argument("dir", nargs="?", help="the cluster's directory (up/down)")
    parser.add_argument("--cpus", type=int, default=4, help="CPUs each node advertises")
    args = parser.parse_args(argv)
    if args.action == "install":
        install()
        return 0
    if args.action == "check":
        missing = missing_binaries()
        print(f"missing: {' '.join(missing)}; {INSTALL_HINT}" if missing else "Slurm and MUNGE are installed")
        return 1 if missing else 0
    if not args.dir:
        parser.error(f"{args.action} needs the cluster's directory")
    cluster = LocalSlurm(Path(args.dir).resolve(), cpus=args.cpus)
    if args.action == "up":
        cluster.up()
        print(f"local Slurm up: nodes {', '.join(cluster.nodes)}; export SLURM_CONF={cluster.conf}")
    else:
        killed = cluster.down()
        print("local Slurm down" + (f"; killed: {killed}" if killed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
