#!/usr/bin/env bash
# The compatibility check of Sluice's public API against its last release
# (README "Compatibility"), with golang.org/x/exp/cmd/apidiff (a tool of the
# cmd module, `go tool apidiff`).
#
#   bash scripts/api.sh check            fail when the API changed incompatibly
#                                        since the newest release under api/
#   bash scripts/api.sh release VERSION  write api/VERSION: the export data of
#                                        every public package (at a release)
#
# A release's API is kept in the repository (api/vX.Y.Z/, one export-data
# file a package and packages.txt), not read from its tag: a checkout need
# not hold tags or history. A public package is one of the root module's
# outside internal/ and cmd/, examples/ (their own modules).
#
# API_ROOT names another module's directory to check (the script's own test).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "${API_ROOT:-$repo}"
GO=${GO:-go}
module=$(GOWORK=off "$GO" list -m -f '{{.Path}}' 2>/dev/null | head -1)
[ -n "$module" ] || { echo "api: no Go module in $PWD" >&2; exit 2; }
# apidiff built once from the cmd module's pinned version (cmd/go.mod's tool).
bin=$(mktemp -d /tmp/sluice-api-XXXXXX)
trap 'rm -rf "$bin"' EXIT
apidiff() {
	[ -x "$bin/apidiff" ] || (cd "$repo/cmd" && "$GO" build -o "$bin/apidiff" golang.org/x/exp/cmd/apidiff)
	"$bin/apidiff" "$@"
}

public_packages() {
	GOWORK=off "$GO" list -f '{{.ImportPath}}' ./... | grep -v -e '/internal/' -e '/internal$' | sort
}

file_of() { # an import path → its export file's name
	local rel=${1#"$module"}
	rel=${rel#/}
	echo "${rel:-${module##*/}}" | tr / _
}

case "${1:-}" in
release)
	version=${2:?usage: scripts/api.sh release vX.Y.Z}
	[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "api: $version is not a version vX.Y.Z" >&2; exit 2; }
	dir=api/$version
	rm -rf "$dir" && mkdir -p "$dir"
	public_packages >"$dir/packages.txt"
	while read -r pkg; do
		apidiff -w "$dir/$(file_of "$pkg").export" "$pkg"
	done <"$dir/packages.txt"
	echo "api: $dir holds the API of $(wc -l <"$dir/packages.txt") packages"
	;;
check)
	base=
	[ -d api ] && base=$(find api -mindepth 1 -maxdepth 1 -type d -name 'v*' | sort -V | tail -1)
	if [ -z "$base" ]; then
		echo "api: no release under api/ yet: nothing to compare"
		exit 0
	fi
	current=$(public_packages)
	broken=0
	while read -r pkg; do
		if ! grep -qxF "$pkg" <<<"$current"; then
			echo "api: $pkg: the package is gone (it is in ${base#api/})"
			broken=1
			continue
		fi
		out=$(apidiff -incompatible "$base/$(file_of "$pkg").export" "$pkg")
		if [ -n "$out" ]; then
			echo "api: $pkg changed incompatibly since ${base#api/}:"
			sed 's/^/  /' <<<"$out"
			broken=1
		fi
	done <"$base/packages.txt"
	if [ $broken = 1 ]; then
		echo "api: an incompatible change needs a new major version (docs: README \"Compatibility\")" >&2
		exit 1
	fi
	echo "api: compatible with ${base#api/} ($(wc -l <"$base/packages.txt") packages)"
	;;
*)
	echo "usage: scripts/api.sh check | release vX.Y.Z" >&2
	exit 2
	;;
esac
