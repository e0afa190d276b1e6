#!/usr/bin/env bash
# Horovod's own PyTorch tests against dpcompare's native layer, side by side with real Horovod.
#
#   bench/horovod_conformance.sh [-k REGEX] [-t SECONDS] [-a "horovod native"] [-o DIR] [-s] HOROVOD_TESTS_DIR [NP...]
#
# HOROVOD_TESTS_DIR is the test/ folder of Horovod's repository at the release the layer follows (0.28.1):
#   git clone --branch v0.28.1 --depth 1 https://github.com/horovod/horovod /tmp/horovod   # then /tmp/horovod/test
# Each test of test/parallel/test_torch.py runs alone, in its own `mpirun -np NP` job limited to -t seconds
# (default 60): once with `python -m pytest` (real Horovod, as `make setup` builds it) and once with
# `python -m dpcompare.native python -m pytest` (the same file, `import horovod.torch` answered by the layer). Each run is
# classified pass / skip / fail / refused (the layer's one-line Unsupported) / hang (killed at the limit) /
# abort (a process killed by a signal, "Fatal Python error"), and the script prints, for each NP, a line per test
# and the table of outcomes: real Horovod, and the layer on the tests real Horovod passes.
#
# -k keeps the tests whose name matches the extended regex (e.g. -k 'join|duplicate'); -a runs only the arms
# named; -o keeps each run's log and outcome in DIR (default: a new temporary folder), and a run already
# recorded there is not run again, so the arms and the NPs can be run at different times and tabulated together.
# -s screens faster: all the selected tests in one job per arm and NP (pytest's JUnit report of each rank tells the
# outcomes; a test that fails on any rank fails), limited to 10 s a test plus -t; a hang there stops the tests after
# it (reported as hang), so rerun those without -s. NP defaults to 2. Run it from the repository root with the project's environment active (`make setup`).
set -u
filter="." limit=60 arms="horovod native" out="" single=""
while getopts "k:t:a:o:s" opt; do
  case $opt in
    k) filter=$OPTARG ;; t) limit=$OPTARG ;; a) arms=$OPTARG ;; o) out=$OPTARG ;; s) single=1 ;;
    *) echo "usage: $0 [-k REGEX] [-t SECONDS] [-a ARMS] [-o DIR] [-s] HOROVOD_TESTS_DIR [NP...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ] || [ ! -f "$1/parallel/test_torch.py" ]; then
  echo "$0: give Horovod's test/ folder (with parallel/test_torch.py), e.g. git clone --branch v0.28.1 https://github.com/horovod/horovod" >&2
  exit 2
fi
tests_dir=$(cd "$1" && pwd); shift
nps=${*:-2}
file="$tests_dir/parallel/test_torch.py"
out=${out:-$(mktemp -d /tmp/horovod-conformance.XXXXXX)}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
# Horovod's test utilities import the old `mock` backport; unittest.mock is the same API
mkdir -p "$out/shim" && echo "from unittest.mock import *  # noqa: F403" >"$out/shim/mock.py"
export PYTHONPATH="$PWD:$out/shim${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python}
names=$(grep -oE '^    def (test_[A-Za-z0-9_]+)' "$file" | awk '{print $2}' | grep -E -- "$filter")

classify() {  # $1: log, $2: exit status → one word
  local log=$1 rc=$2
  # a refusal first: a rank refused while the other waits for it ends at the time limit too
  if grep -q "not supported by dpcompare's native Horovod layer" "$log"; then echo refused
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ] || [ "$rc" = 143 ]; then echo hang
  elif grep -qE "Fatal Python error|exited on signal|Segmentation fault|core dumped|Aborted" "$log"; then echo abort
  elif grep -qE "[0-9]+ (failed|error)" "$log"; then echo fail
  elif grep -qE "[0-9]+ passed" "$log"; then echo pass
  elif grep -qE "[0-9]+ skipped" "$log"; then echo skip
  else echo abort
  fi
}

command_of() {  # $1: arm → the command that runs pytest in it
  case $1 in
    horovod) echo "$python -m pytest" ;;
    native) echo "$python -m dpcompare.native python -m pytest" ;;
    *) echo "$0: unknown arm $1 (horovod, native)" >&2; exit 2 ;;
  esac
}

screen() {  # $1: np, $2: arm: every selected test not recorded yet, in one job
  local np=$1 arm=$2 todo=() name
  for name in $names; do [ -f "$out/np$np.$arm.$name.outcome" ] || todo+=("$file::TorchTests::$name"); done
  [ ${#todo[@]} = 0 ] && return
  local job="$out/np$np.$arm.screen"
  rm -f "$job".rank*.xml
  PYTHONUNBUFFERED=1 timeout -k 10 $((10 * ${#todo[@]} + limit)) mpirun -np "$np" --oversubscribe --bind-to none \
    --tag-output sh -c "exec $(command_of "$arm") -v --color=no -p no:cacheprovider -o faulthandler_timeout=$limit \
    --junitxml=$job.rank\${OMPI_COMM_WORLD_RANK:-0}.xml \"\$@\"" sh "${todo[@]}" >"$job.log" 2>&1
  local rc=$?
  "$python" - "$job" "$np" "$rc" "${todo[@]}" <<'PY'
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

job, np, rc, todo = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
got: dict[str, list[tuple[str, str]]] = {}
WORDS = {"PASSED": "pass", "FAILED": "fail", "ERROR": "fail", "SKIPPED": "skip"}
for r in range(np):
    xml = Path(f"{job}.rank{r}.xml")
    if not xml.exists():  # killed: what pytest -v printed as each test ended
        log = Path(f"{job}.log").read_text(errors="replace")
        for m in re.finditer(rf"^\[\d+,{r}\]<stdout>:.*::(test_\w+) (?:\[\d+,{r}\]<stdout>:)?(PASSED|FAILED|ERROR|SKIPPED)", log, re.M):
            got.setdefault(m.group(1), []).append((WORDS[m.group(2)], ""))
        continue
    for case in ET.parse(xml).getroot().iter("testcase"):
        kind, text = "pass", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind, text = {"failure": "fail", "error": "fail", "skipped": "skip"}[child.tag], \
                    (child.get("message") or "") + "\n" + (child.text or "")
        got.setdefault(case.get("name"), []).append((kind, text))
for node in todo:
    name = node.rsplit("::", 1)[1]
    runs = got.get(name, [])
    text = "\n".join(t for _, t in runs)
    if len(runs) < np:
        outcome = "hang" if rc in (124, 137, 143) else "abort"   # killed at the limit (or by hand)
    elif "not supported by dpcompare's native Horovod layer" in text:
        outcome = "refused"
    elif any(k == "fail" for k, _ in runs):
        outcome = "fail"
    else:
        outcome = "skip" if all(k == "skip" for k, _ in runs) else "pass"
    base = Path(job).with_name(Path(job).name.replace(".screen", "." + name))
    base.with_name(base.name + ".log").write_text(text)
    base.with_name(base.name + ".outcome").write_text(outcome + "\n")
    print(f"np={np} {Path(job).name.split('.')[1]} {name}: {outcome} (screened)", file=sys.stderr)
PY
}

for np in $nps; do
  if [ -n "$single" ]; then
    for arm in $arms; do screen "$np" "$arm"; done
    continue
  fi
  for name in $names; do
    for arm in $arms; do
      rec="$out/np$np.$arm.$name"
      [ -f "$rec.outcome" ] && continue
      read -r -a run <<<"$(command_of "$arm")"
      timeout -k 10 "$limit" mpirun -np "$np" --oversubscribe --bind-to none \
        "${run[@]}" -q -p no:cacheprovider "$file::TorchTests::$name" >"$rec.log" 2>&1
      rc=$?
      outcome=$(classify "$rec.log" "$rc")
      echo "$outcome" >"$rec.outcome"
      echo "np=$np $arm $name: $outcome" >&2
    done
  done
done

"$python" - "$out" "$nps" "$arms" "$filter" <<'EOF'
import re
import sys
from pathlib import Path

out, nps, arms, pattern = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
OUTCOMES = ("pass", "skip", "fail", "refused", "hang", "abort")


def reason(log: Path) -> str:
    """The line that says why a run did not pass (the layer's refusal, the assertion, the error)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    for pat in (r"(hvd\.\S+ is not supported by dpcompare's native Horovod layer)", r"^E\s+(\w*Error: .{0,140})",
                r"^E\s+(.{0,140})", r"(Fatal Python error: .{0,80})"):
        m = re.search(pat, text, re.M)
        if m:
            return m.group(1).strip()
    return text.strip().splitlines()[0][:160] if text.strip() else ""


for np in nps:
    got: dict[str, dict[str, str]] = {}
    for f in sorted(out.glob(f"np{np}.*.outcome")):
        _, arm, name = f.name[: -len(".outcome")].split(".", 2)
        if re.search(pattern, name) and arm in arms:
            got.setdefault(name, {})[arm] = f.read_text().strip()
    print(f"\n## np={np}: {len(got)} tests of test_torch.py\n")
    for name, by in sorted(got.items()):
        line = f"{name:55s} " + "  ".join(f"{a}={by.get(a, '-'):8s}" for a in arms)
        if by.get("native", "pass") != "pass" and by.get("horovod", "pass") == "pass":
            line += "  " + reason(out / f"np{np}.native.{name}.log")
        print(line)
    real_pass = [n for n, by in got.items() if by.get("horovod") == "pass"]
    print(f"\n| outcome | real Horovod | native layer, all tests | native layer, on the {len(real_pass)} tests "
          "real Horovod passes |\n|---|---|---|---|")
    for o in OUTCOMES:
        real = sum(by.get("horovod") == o for by in got.values())
        native = sum(by.get("native") == o for by in got.values())
        on_pass = sum(got[n].get("native") == o for n in real_pass)
        print(f"| {o} | {real if 'horovod' in arms else '-'} | {native if 'native' in arms else '-'} | "
              f"{on_pass if 'native' in arms and 'horovod' in arms else '-'} |")
print(f"\nlogs: {out}")
EOF
