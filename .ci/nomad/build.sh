#!/usr/bin/env bash
# Builds the Nomad binary the tier drives, from the Go module proxy, once per
# version: the result is cached under $NOMAD_CACHE/nomad-$NOMAD_VERSION/nomad and
# a second run only prints its path. Nomad's own go.mod pins its api module by a
# replace to ./api, which a module download does not carry; the replace is
# pointed at the published api pseudo-version of the same release.
# Prints the binary's path on stdout; progress goes to stderr.
set -euo pipefail

GO=${GO:-go}
NOMAD_VERSION=${NOMAD_VERSION:-1.11.3}
NOMAD_API=${NOMAD_API:-v0.0.0-20260907080526-08ef8f3d26da}
NOMAD_CACHE=${NOMAD_CACHE:-/var/cache/wasmcsi}
out=$NOMAD_CACHE/nomad-$NOMAD_VERSION/nomad

if [ -x "$out" ]; then
	echo "$out"
	exit 0
fi
mkdir -p "$(dirname "$out")"
# One build at a time: a second caller waits for the first one's binary.
exec 9>"$(dirname "$out")/.lock"
flock 9
if [ -x "$out" ]; then
	echo "$out"
	exit 0
fi

dir=$("$GO" mod download -json "github.com/hashicorp/nomad@v$NOMAD_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] || { echo "nomad build: no module folder for v$NOMAD_VERSION" >&2; exit 1; }
src=$(mktemp -d "${TMPDIR:-/tmp}/nomad-src.XXXXXX")
trap 'rm -rf "$src"' EXIT
cp -r "$dir/." "$src/"
chmod -R u+w "$src"
cd "$src"
"$GO" mod edit -replace "github.com/hashicorp/nomad/api=github.com/hashicorp/nomad/api@$NOMAD_API"
echo "nomad build: v$NOMAD_VERSION in $src (several minutes on 2 cores)" >&2
start=$(date +%s)
GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=${CGO_ENABLED:-1} "$GO" build -trimpath -ldflags "-s -w" -o "$out.tmp" .
mv "$out.tmp" "$out"
echo "nomad build: done in $(( $(date +%s) - start )) s" >&2
echo "$out"
