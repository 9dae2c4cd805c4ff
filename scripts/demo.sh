#!/usr/bin/env bash
# The lakefuse demo: set up (.venv), create a repository on local storage with a
# small generated dataset and a few commits (branch, change, diff, commit, merge,
# tag), then MOUNT it on a real mount point and read a branch, a tag and main~1
# through plain ls/cat, write into a branch through the mount, look at
# .lakefuse/status, commit with echo and read the new commit by its ID.
# The mount is left running; the last lines say how to
# unmount it and how to remove what the demo made.
#
#   bash scripts/demo.sh
#
# Runs on a fresh temporary home (LAKEFUSE_HOME=$(mktemp -d)) unless LAKEFUSE_HOME
# is set; the mount point is a fresh temporary directory unless DEMO_MOUNTPOINT is
# set. Exits non-zero if any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

LAKEFUSE="$PWD/.venv/bin/lakefuse"
own_home=0
if [ -z "${LAKEFUSE_HOME:-}" ]; then
    LAKEFUSE_HOME="$(mktemp -d "${TMPDIR:-/tmp}/lakefuse-demo.XXXXXX")"
    own_home=1
fi
export LAKEFUSE_HOME
work="$(mktemp -d "${TMPDIR:-/tmp}/lakefuse-demo-data.XXXXXX")"
mnt="${DEMO_MOUNTPOINT:-$(mktemp -d "${TMPDIR:-/tmp}/lakefuse-demo-mnt.XXXXXX")}"
mkdir -p "$mnt"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

# A fresh home gets the repository "demo"; a given home gets a new name, so nothing there is touched.
repo=demo
if [ "$own_home" = 0 ]; then repo="demo-$(date +%s)-$$"; fi
R="lakefs://$repo"

bold='' plain=''
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; fi
step_no=0
step() {
    step_no=$((step_no + 1))
    printf '\n%s== %d. %s%s\n' "$bold" "$step_no" "$*" "$plain"
}
run() { # show the command (quoted as a shell would need it), then run it
    printf '$ lakefuse'
    printf ' %q' "$@"
    printf '\n'
    "$LAKEFUSE" "$@"
}
sh_run() { # show a shell command, then run it
    printf '$ %s\n' "$*"
    bash -c "$*"
}

start=$(date +%s)
echo "lakefuse demo: home $LAKEFUSE_HOME"

step "Create a repository (storage namespace: a local directory under the home)"
run repo create "$R"

step "Generate a small dataset: CSV and JSON files in nested directories"
mkdir -p "$work/dataset/sales/2024" "$work/dataset/customers" "$work/dataset/meta"
for m in 01 02 03; do
    {
        echo "day,store,amount"
        for d in 1 2 3 4 5; do echo "$d,store-$((d % 3)),$((d * 10 + 10#$m))"; done
    } >"$work/dataset/sales/2024/$m.csv"
done
printf '[{"id": 1, "name": "Ada"}, {"id": 2, "name": "Grace"}]\n' >"$work/dataset/customers/customers.json"
printf '{"source": "demo", "months": ["01", "02", "03"]}\n' >"$work/dataset/meta/info.json"
printf 'A tiny sales dataset made by scripts/demo.sh\n' >"$work/dataset/README.txt"
(cd "$work/dataset" && find . -type f | sort | sed 's|^\./|  |')

step "Upload it recursively to main under dataset/ and commit"
run fs upload "$R/main/dataset/" --source "$work/dataset" --recursive
run commit "$R/main" -m "Add the sales dataset" --meta source=demo.sh

step "List: directories fold into common prefixes; --recursive lists every object"
run fs ls "$R/main/dataset/"
run fs ls "$R/main/dataset/sales/" --recursive

step "Create a branch to work on"
run branch create "$R/fix-march" --source main
run branch list "$R"

step "On the branch: correct March's figures and delete the README"
sed 's/,store-0,/,store-zero,/' "$work/dataset/sales/2024/03.csv" >"$work/03-fixed.csv"
run fs upload "$R/fix-march/dataset/sales/2024/03.csv" --source "$work/03-fixed.csv"
run fs rm "$R/fix-march/dataset/README.txt"

step "The branch's uncommitted changes"
run diff "$R/fix-march"

step "Commit them on the branch"
run commit "$R/fix-march" -m "Fix March: rename store-0"

step "main vs the branch"
run diff "$R/main" "$R/fix-march"

step "Merge the branch into main"
run merge "$R/fix-march" "$R/main"

step "History of main (first parents, newest first)"
run log "$R/main"

step "Tag the release"
run tag create "$R/v1.0" main
run tag list "$R"

step "Read through ref expressions: main~1 is main before the merge"
echo "-- March on main~1 (before the merge):"
run fs cat "$R/main~1/dataset/sales/2024/03.csv"
echo "-- March on v1.0:"
run fs cat "$R/v1.0/dataset/sales/2024/03.csv"
run fs stat "$R/v1.0/dataset/sales/2024/03.csv"

step "Mount the repository: every branch and tag is a directory (FUSE; commits and tags are read-only)"
run mount "$R" "$mnt"
sh_run "ls -l '$mnt'"

step "A branch: ls and cat through the mount"
sh_run "ls -lR '$mnt/main/dataset' | head -n 20"
sh_run "cat '$mnt/main/dataset/sales/2024/03.csv'"

step "A tag: the same file as tagged"
sh_run "cat '$mnt/v1.0/dataset/sales/2024/03.csv'"

step "Any ref expression is a path too: main~1 is main before the merge (README.txt is still there)"
sh_run "ls '$mnt/main~1/dataset'"
sh_run "cat '$mnt/main~1/dataset/sales/2024/03.csv'"
sh_run "cat '$mnt/main~1/.lakefuse/head'"

step "Commits and tags are immutable: writes fail with EROFS"
sh_run "touch '$mnt/v1.0/dataset/new.txt' 2>&1 || true"

step "Object metadata as extended attributes"
f="$mnt/main~1/dataset/README.txt"
printf '$ getfattr -d %q   # (python3 here: getfattr may not be installed)\n' "$f"
python3 -c 'import os, sys; [print(f"{n}={os.getxattr(sys.argv[1], n).decode()}") for n in os.listxattr(sys.argv[1])]' "$f"

step "Branch trees are writable: write into main through the mount"
sh_run "mkdir -p '$mnt/main/dataset/sales/2025' && printf 'day,store,amount\\n1,store-1,42\\n' > '$mnt/main/dataset/sales/2025/01.csv'"
sh_run "cp '$mnt/main/dataset/sales/2024/01.csv' '$mnt/main/dataset/sales/2024/01-copy.csv'"
sh_run "rm '$mnt/main/dataset/customers/customers.json'"

step "What is uncommitted, as git status --porcelain would say it"
sh_run "cat '$mnt/main/.lakefuse/status'"

step "Commit with echo; reading the control file back gives the outcome"
sh_run "echo 'Add January 2025 through the mount' > '$mnt/main/.lakefuse/commit'"
sh_run "cat '$mnt/main/.lakefuse/commit'"
commit_id="$(cat "$mnt/main/.lakefuse/head")"

step "The new commit is a tree of its own, by its ID"
sh_run "ls '$mnt/$commit_id/dataset/sales'"
sh_run "cat '$mnt/$commit_id/dataset/sales/2025/01.csv'"

printf '\n%sDone in %ds. The mount stays up.%s\n' "$bold" "$(( $(date +%s) - start ))" "$plain"
echo "  browse:    ls $mnt/main   cat $mnt/v1.0/dataset/sales/2024/03.csv   ls $mnt/main~1/"
echo "  CLI:       LAKEFUSE_HOME=$LAKEFUSE_HOME $LAKEFUSE log $R/main"
echo "  unmount:   LAKEFUSE_HOME=$LAKEFUSE_HOME $LAKEFUSE umount $mnt"
if [ "$own_home" = 1 ]; then
    echo "  clean up:  (after unmounting) rm -rf $LAKEFUSE_HOME $mnt"
fi
