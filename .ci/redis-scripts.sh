# Sourced by .ci/redis-instructions and .ci/redis-cpu: a script's text as
# crates/tollgate-redis/src/scripts.rs assembles it, its files read from scripts.rs itself (so the
# measurements follow what the crate runs), in the working tree or at a commit.
#
#   script_text NAME [REV]   clock.lua, then the files scripts.rs's `script!` of NAME.lua lists
#                            (e.g. reset: reset.lua); for a `batched!` one, its libraries, its
#                            body wrapped as decide_call with its shape, then batch.lua;
#                            a reference (reference/NAME.lua, the least work a decision needs)
#                            alone, always from the working tree.
#   is_batched NAME [REV]    true when scripts.rs runs NAME.lua in batches (a batch's ARGV then
#                            ends with the key counts and the number of calls).
#   counter_args REV         counters.lua's ARGV for one enforcing counter of LIMIT per WINDOW
#                            µs (their values from the environment), as at REV: 4 words, or 7
#                            before the role took the calendar and `ago` in (3, 7 in scripts.rs).
redis_scripts_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/crates/tollgate-redis"
script_text() {
  local name=$1 rev=${2:-} f files call
  if [[ $name == reference/* ]]; then
    cat "$redis_scripts_dir/scripts/$name.lua"
    return
  fi
  show() { if [[ -z $rev ]]; then cat "$redis_scripts_dir/$1"; else git -C "$redis_scripts_dir" show "$rev:./$1"; fi; }
  local line
  line=$(show src/scripts.rs | tr -d '\n' | grep -o "\(script\|batched\)!([^;]*\"$name.lua\"[^;]*;")
  [[ -n $line ]] || { echo "scripts.rs${rev:+ at $rev} has no script ending in $name.lua" >&2; return 1; }
  files=$(echo "$line" | grep -o '"[a-z_]*\.lua"' | tr -d '"')
  if [[ $line == batched!* ]]; then
    local shape
    shape=$(echo "$line" | grep -o '([0-9]*, [0-9]*)' | tr -d '()' | tr '\n' ' ' | awk '{ printf "%s %s %s %s", $1, $2, $3, $4 }' | tr -d ',')
    show scripts/clock.lua
    if show src/scripts.rs | grep -q 'local KEYS, ARGV, answer = KEYS, ARGV, {}'; then
      printf 'local KEYS, ARGV, answer = KEYS, ARGV, {}\n'
      call='local function decide_call(k, a, nkeys)'
    else
      call='local function decide_call(KEYS, ARGV)'  # before bodies took offsets
    fi
    for f in $files; do [[ $f == "$name.lua" ]] || show "scripts/$f"; done
    read -r a ak r rk <<<"$shape"
    printf 'local ARGS, ARGS_PER_KEY, REPLY, REPLY_PER_KEY = %s, %s, %s, %s\n%s\n' "$a" "$ak" "$r" "$rk" "$call"
    show "scripts/$name.lua"
    printf 'end\n'
    show scripts/batch.lua
    return
  fi
  for f in clock.lua $files; do show "scripts/$f"; done
}
is_batched() {
  [[ $(script_text "$@") == *$'\nlocal function decide_call('* ]]
}
counter_args() {
  local rev=${1:-}
  if script_text counters "$rev" | grep -q '^local ARGS, ARGS_PER_KEY, REPLY, REPLY_PER_KEY = 3, 7,'; then
    echo "$LIMIT $WINDOW 1 1 0 0 0"
  else
    echo "$LIMIT $WINDOW 1 1"
  fi
}
