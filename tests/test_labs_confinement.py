"""A submission sees only its own folder and the engine, writes nowhere else, leaves no process running, and cannot
forge the reference another student is judged by (issue 44, items 5 and 6).

Lab 7 (the block hash) is the attacked lab. One `grade` run over a class of attackers and one honest student;
the reference cache is attacked through `check`, as a student on a shared machine would.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minivllm.labs import confine, reaper, refcache
from minivllm.labs.registry import LABS

pytestmark = pytest.mark.timeout(900)

from test_labs_isolation import HONEST  # noqa: E402 (lab 7's honest submission, one copy)
N7 = len(LABS[7].checks)
MARKER = f"minivllm-daemon-{os.getpid()}-{time.monotonic_ns()}"  # names the daemon's command line, nothing else


def _class(root: Path) -> dict:
    alice = root / "alice_honest" / "exercises" / "lab07_block_hash.py"
    sources = {
        "alice_honest": HONEST,
        # a classmate's file by its absolute path, at import
        "bob_reads_classmate": f"exec(compile(open({str(alice)!r}).read(), __file__, 'exec'))\n",
        # the same by a path relative to its own file (a private copy runs: there is no classmate beside it)
        "bob2_reads_beside": "import os\n_p = os.path.join(os.path.dirname(__file__), '..', '..', 'alice_honest',"
                             " 'exercises', 'lab07_block_hash.py')\nexec(compile(open(_p).read(), __file__, 'exec'))\n",
        # the reference solution read from the installed package
        "carol_execs_reference": "import os\nimport minivllm\n_p = os.path.join(os.path.dirname(minivllm.__file__),"
                                 " 'labs', 'exercises', 'lab07_block_hash.py')\n"
                                 "exec(compile(open(_p).read(), __file__, 'exec'))\n",
        # writes into the class folder and appends to a classmate's file
        "dave_writes": f"try:\n    open({str(root / 'planted.txt')!r}, 'w').write('x')\n"
                       f"    open({str(alice)!r}, 'a').write('\\nraise SystemExit(1)\\n')\nexcept OSError:\n    pass\n"
                       + HONEST,
        # a daemon that outlives its check
        "erin_daemon": f"import subprocess, sys\ntry:\n    subprocess.Popen([sys.executable, '-c', 'import time; "
                       f"time.sleep(600)', {MARKER!r}], start_new_session=True)\nexcept OSError:\n    pass\n" + HONEST,
    }
    for name, source in sources.items():
        (root / name / "exercises").mkdir(parents=True)
        (root / name / "exercises" / "lab07_block_hash.py").write_text(source)
    return sources


def _daemons() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and MARKER.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    sources = _class(root)
    out = tmp_path_factory.mktemp("out")
    result = subprocess.run([sys.executable, "-m", "minivllm.labs", "grade", str(root), "--csv", str(out / "g.csv"),
                             "--labs", "7", "--timeout", "60"], capture_output=True, text=True, timeout=800)
    daemons = _daemons()
    for pid in daemons:  # the old grader left them: end them here so the test run leaves nothing either
        os.kill(pid, 9)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    scores = {r["student"]: r["score"] for r in csv.DictReader(open(out / "g.csv"))}
    feedback = {part.split(",")[0].strip(): part for part in result.stdout.split("== ")[1:]}
    return root, sources, scores, feedback, daemons


def test_the_honest_student_scores_full_marks_beside_the_attackers(graded):
    _, _, scores, feedback, _ = graded
    assert scores["alice_honest"] == "1.00", feedback["alice_honest"]


@pytest.mark.parametrize("student, reason", [
    ("bob_reads_classmate", "reads only its own folder and the engine"),
    ("bob2_reads_beside", "FileNotFoundError"),
    ("carol_execs_reference", "reads only its own folder and the engine"),
    ("dave_writes", "writes only in its working folder"),
    ("erin_daemon", "started a process"),
])
def test_each_attack_scores_0_with_its_reason(graded, student, reason):
    _, _, scores, feedback, _ = graded
    assert scores[student] == "0.00" and reason in feedback[student], feedback[student]


def test_nothing_in_the_class_folder_changed(graded):
    root, sources, _, _, _ = graded
    assert not (root / "planted.txt").exists()
    for name, source in sources.items():
        assert (root / name / "exercises" / "lab07_block_hash.py").read_text() == source, name


def test_no_process_a_submission_started_outlives_grade(graded):
    assert graded[4] == []


def test_a_process_that_left_its_session_is_killed_with_the_job(tmp_path):
    """The reaper's own layer (a daemon started by native code, past the audit hook): a double-forked, setsid'd
    grandchild is re-parented to the subreaper and killed with its job's session."""
    code = textwrap.dedent(f'''
        import os, sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from minivllm.labs import reaper
        assert reaper.become_subreaper()
        r, w = os.pipe()
        job = os.fork()
        if job == 0:
            os.setsid()
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.write(w, str(os.getpid()).encode() + b"\\n")
                    time.sleep(600)
                os._exit(0)
            os._exit(0)
        daemon = int(os.read(r, 64).split()[0])
        os.waitpid(job, 0)
        print(reaper.kill_all(job), daemon, os.path.exists(f"/proc/{{daemon}}"))
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    killed, daemon, alive = out.stdout.split()
    assert int(killed) >= 1 and alive == "False", out.stderr


def test_a_forged_reference_file_is_not_read(tmp_path, monkeypatch):
    """A reference file rewritten by anyone without the key (a submission on a machine without Landlock, past the
    audit hook) fails its signature: the grader recomputes it instead of judging by it."""
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    refcache.store(7, 0, "digest = the specified sha256", {"digests": ["ab"]})
    assert refcache.load(7, 0, "digest = the specified sha256") == {"digests": ["ab"]}
    path = refcache.folder() / "lab07-check00.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "obs": {"digests": ["forged"]}}))
    assert refcache.load(7, 0, "digest = the specified sha256") is None
    path.write_text(json.dumps({"check": "digest = the specified sha256", "obs": {"digests": ["forged"]}}))
    assert refcache.load(7, 0, "digest = the specified sha256") is None


POISON = textwrap.dedent('''
    import json
    for _p in FILES:  # the paths a student finds on a shared machine (a listing is refused too)
        try:
            json.dump({"check": "x", "obs": {"poisoned": True}}, open(_p, "w"))
        except OSError:
            pass
''') + HONEST


def test_a_submission_cannot_poison_the_reference_cache(tmp_path):
    """Issue 44 item 5: a submission rewrote every cached reference of lab 7; the next honest student scored 0.17."""
    cache = tmp_path / "cache"
    cache.mkdir()
    real = Path(os.environ.get("MINIVLLM_CACHE_DIR") or Path.home() / ".cache" / "minivllm").expanduser()
    for shared in ("models", "ops"):  # the converted model and built kernels: not what is attacked, slow to redo
        if (real / shared).exists():
            (cache / shared).symlink_to(real / shared)
    env = {**os.environ, "MINIVLLM_CACHE_DIR": str(cache)}

    def check(name, source):
        (tmp_path / name).mkdir()
        (tmp_path / name / "lab07_block_hash.py").write_text(source)
        out = subprocess.run([sys.executable, "-m", "minivllm.labs", "check", "7", "--all", "--submission",
                              str(tmp_path / name)], capture_output=True, text=True, timeout=400, env=env)
        return out.stdout
    assert check("first", HONEST).splitlines()[-1].endswith("score 1.00")
    files = sorted(str(f) for f in (cache / "labs-reference").glob("*/lab07-*.json"))
    assert len(files) == N7
    poisoner = check("poisoner", f"FILES = {files!r}\n" + POISON)
    assert "score 0.00" in poisoner and "writes only in its working folder" in poisoner, poisoner
    assert all("poisoned" not in Path(f).read_text() for f in files)
    assert check("after", HONEST).splitlines()[-1].endswith("score 1.00")


def test_the_kernel_confines_what_native_code_could_reach(tmp_path):
    """Layer 1 alone (no audit hook): a process under confine.landlock can neither read a denied folder nor write
    outside its scratch folder, whatever calls the kernel."""
    if confine.landlock_abi() < 1:
        pytest.skip("this kernel has no Landlock: only the audit hooks confine a submission here")
    (tmp_path / "denied").mkdir()
    (tmp_path / "denied" / "secret.txt").write_text("s")
    (tmp_path / "scratch").mkdir()
    code = textwrap.dedent(f'''
        import os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from minivllm.labs import confine
        assert confine.landlock({str(tmp_path / "scratch")!r}, [{str(tmp_path / "denied")!r}])
        def tries(path, flags):
            try:
                os.close(os.open(path, flags, 0o600))
                return "allowed"
            except PermissionError:
                return "denied"
        print(tries({str(tmp_path / "denied" / "secret.txt")!r}, os.O_RDONLY),
              tries({str(tmp_path / "elsewhere.txt")!r}, os.O_WRONLY | os.O_CREAT),
              tries({str(tmp_path / "scratch" / "mine.txt")!r}, os.O_WRONLY | os.O_CREAT),
              tries(os.__file__, os.O_RDONLY))
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["denied", "denied", "allowed", "allowed"], out.stderr
