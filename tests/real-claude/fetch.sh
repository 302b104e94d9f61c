#!/usr/bin/env bash
# Fetches the Claude Code CLI that the end-to-end tests run: the binary the pinned
# claude-agent-sdk wheel on PyPI bundles (claude_agent_sdk/_bundled/claude). Prints the binary's
# path, relative to the repository root, on success. A binary fetched earlier is reused. The
# cache directory is the first argument, or target/real-claude.
set -euo pipefail
VERSION=0.2.184
cd "$(dirname "$0")/../.."
cache="${1:-target/real-claude}"
dir="$cache/$VERSION"
bin="$dir/claude"
mkdir -p "$dir"
# Test processes fetch in parallel: one at a time.
exec 9>"$dir/.lock"
flock 9
if [ ! -x "$bin" ]; then
  pip="$(command -v pip || command -v pip3 || true)"
  if [ -z "$pip" ]; then
    echo "fetch.sh: pip is required to download claude-agent-sdk==$VERSION" >&2
    exit 1
  fi
  rm -rf "$dir/wheel"
  "$pip" download --quiet --no-deps --only-binary=:all: "claude-agent-sdk==$VERSION" -d "$dir/wheel" >&2
  wheel="$(ls "$dir/wheel"/claude_agent_sdk-"$VERSION"-*.whl | head -1)"
  unzip -q -o -j "$wheel" 'claude_agent_sdk/_bundled/claude' -d "$dir/" >&2
  chmod +x "$bin"
  rm -rf "$dir/wheel"
fi
echo "$bin"
