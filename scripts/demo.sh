#!/usr/bin/env bash
# A short, narrated tour of lakefuse's version control, lakectl-style:
# set up (.venv), then create a repository on local storage, upload a small
# generated dataset, branch, change, diff, commit, merge, log, tag, read through
# a ref expression, and look inside one of the lakeFS range files written.
#
#   bash scripts/demo.sh
#
# Runs on a fresh temporary home (LAKEFUSE_HOME=$(mktemp -d)) unless
# LAKEFUSE_HOME is set; the temporary one is removed at the end
# (KEEP_DEMO=1 keeps it). Exits non-zero if any step fails.
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
cleanup() {
    rm -rf "$work"
    if [ "$own_home" = 1 ] && [ -z "${KEEP_DEMO:-}" ]; then rm -rf "$LAKEFUSE_HOME"; fi
}
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

step "Inside the storage: main's metarange lists its ranges; dump one range file (lakeFS's SSTable format)"
ns_dir="$LAKEFUSE_HOME/storage/$repo"
metarange=$("$LAKEFUSE" show "$R/main" --json | sed -n 's/.*"meta_range_id": "\([0-9a-f]*\)".*/\1/p')
range=$("$LAKEFUSE" sst dump --json --limit 1 "$ns_dir/_lakefs/$metarange" |
    sed -n 's/.*"identity": "\([0-9a-f]*\)".*/\1/p' | head -n 1)
echo "metarange $metarange -> first range $range"
echo "(rocksdb.* table properties hidden)"
run sst dump "$ns_dir/_lakefs/$range" | grep -v '^  rocksdb\.'
echo "A range's ID is the hash of its records and properties, which is also its file name:"
run sst id "$ns_dir/_lakefs/$range"

printf '\n%sDone in %ds.%s\n' "$bold" "$(( $(date +%s) - start ))" "$plain"
if [ "$own_home" = 1 ] && [ -z "${KEEP_DEMO:-}" ]; then
    echo "The temporary home is removed now; KEEP_DEMO=1 bash scripts/demo.sh keeps it."
else
    echo "Explore: LAKEFUSE_HOME=$LAKEFUSE_HOME .venv/bin/lakefuse log $R/main"
fi
