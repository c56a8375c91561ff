# Sourced by .ci/redis-instructions and .ci/redis-cpu: a script's text as
# crates/tollgate-redis/src/scripts.rs assembles it, its files read from scripts.rs itself (so the
# measurements follow what the crate runs), in the working tree or at a commit.
#
#   script_text NAME [REV]   clock.lua, then the files scripts.rs's `script!` of NAME.lua lists
#                            (e.g. counters: window_lib.lua all_or_nothing.lua counters.lua);
#                            a reference (reference/NAME.lua, the least work a decision needs)
#                            alone, always from the working tree.
redis_scripts_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/crates/tollgate-redis"
script_text() {
  local name=$1 rev=${2:-} f files
  if [[ $name == reference/* ]]; then
    cat "$redis_scripts_dir/scripts/$name.lua"
    return
  fi
  show() { if [[ -z $rev ]]; then cat "$redis_scripts_dir/$1"; else git -C "$redis_scripts_dir" show "$rev:./$1"; fi; }
  files=$(show src/scripts.rs | grep "\"$name.lua\")" | grep -o '"[a-z_]*\.lua"' | tr -d '"')
  [[ -n $files ]] || { echo "scripts.rs${rev:+ at $rev} has no script! ending in $name.lua" >&2; return 1; }
  for f in clock.lua $files; do show "scripts/$f"; done
}
