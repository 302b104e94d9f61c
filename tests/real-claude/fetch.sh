#!/usr/bin/env bash
# Fetches the Claude Code CLI the end-to-end tests run: the binary that the pinned
# claude-agent-sdk wheel on PyPI bundles. Prints the binary's path on success.
# Reuses an earlier download; the cache directory is the first argument, or target/real-claude.
set -euo pipefail
VERSION=0.2.184
cd "$(dirname "$0")/../.."
cache="${1:-target/real-claude}"
bin="$cache/$VERSION/claude"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache/$VERSION/wheel"
command -v pip >/dev/null || command -v pip3 >/dev/null || {
  echo "fetch.sh: pip is required to download claude-agent-sdk==$VERSION" >&2
  exit 1
}
pip="$(command -v pip || command -v pip3)"
"$pip" download --quiet --no-deps "claude-agent-sdk==$VERSION" -d "$cache/$VERSION/wheel" >&2
wheel="$(ls "$cache/$VERSION/wheel"/claude_agent_sdk-"$VERSION"-*.whl | head -1)"
unzip -q -o -j "$wheel" 'claude_agent_sdk/_bundled/claude' -d "$cache/$VERSION/" >&2
chmod +x "$bin"
echo "$bin"
