# Sourced by .ci/redis-instructions and .ci/redis-cpu: a script's text as
# crates/tollgate-redis/src/scripts.rs assembles it, its files read from scripts.rs itself (so the
# measurements follow what the crate runs), in the working tree or at a commit.
#
#   script_text NAME [REV]   clock.lua, then the files scripts.rs's `script!` of NAME.lua lists
#                            (e.g. reset: reset.lua); for a `batched!` one, its libraries, its
#                            body wrapped as decide_call with its shape, then batch.lua
#                            (since batch.lua is `run`: between the line that keeps KEYS and
#                            ARGV and the one that calls it, as what EVALSHA runs);
#                            a reference (reference/NAME.lua, the least work a decision needs)
#                            alone, always from the working tree.
#   library_text NAME REV F  a batched script as the library that registers it as function F
#                            (what FUNCTION LOAD takes, for FCALL).
#   is_function NAME [REV]   true when scripts.rs runs NAME.lua as a Redis function (FCALL),
#                            from the same text as its EVALSHA script (since batch.lua is `run`).
#   is_batched NAME [REV]    true when scripts.rs runs NAME.lua in batches (a batch's ARGV then
#                            ends with the key counts and the number of calls).
#   call_words NAME REV NOW  one call's ARGV of a decision script as at REV, one word a line:
#                            mode 1 (take) of a quota no call exhausts, on NOW ('' for Redis
#                            TIME). Before run.lua, each call took now and the minimum TTL
#                            itself; a counter took 7 words before the role took the calendar
#                            and `ago` in, 4 before it took the hits in.
#   run_words NAME REV NOW CALLS
#                            what a batched run takes after its calls' ARGV (and key counts):
#                            the clock's words (now, the minimum TTL and, since fixed windows
#                            are string keys, the expiry shift: run.lua), then CALLS; since
#                            the clock's words are sent only on a passed-in now, CALLS is then
#                            negated. Before run.lua, CALLS alone.
redis_scripts_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/crates/tollgate-redis"
show_at() { # REV FILE (under crates/tollgate-redis) -> its text
  if [[ -z $1 ]]; then cat "$redis_scripts_dir/$2"; else git -C "$redis_scripts_dir" show "$1:./$2"; fi
}
script_text() {
  if is_function "$@"; then
    printf 'local EVAL_KEYS, EVAL_ARGV = KEYS, ARGV\n'
    batched_body "$@"
    printf 'return run(EVAL_KEYS, EVAL_ARGV)\n'
  else
    batched_body "$@"
  fi
}
library_text() { # NAME REV FUNCTION -> the library that registers FUNCTION (scripts.rs's Batched::new)
  printf '#!lua name=%s\n' "$3"
  batched_body "$1" "$2"
  printf "redis.register_function('%s', run)\n" "$3"
}
is_function() { # NAME [REV]: scripts.rs runs NAME.lua as a Redis function (FCALL) at REV
  [[ $1 != reference/* ]] && is_batched_text "$1" "${2:-}" &&
    show_at "${2:-}" scripts/batch.lua | grep -q '^local function run(keys, args)'
}
batched_body() {
  local name=$1 rev=${2:-} f files call
  if [[ $name == reference/* ]]; then
    cat "$redis_scripts_dir/scripts/$name.lua"
    return
  fi
  show() { show_at "$rev" "$1"; }
  local line
  line=$(show src/scripts.rs | tr -d '\n' | grep -o "\(script\|batched\)!([^;]*\"$name.lua\"[^;]*;")
  [[ -n $line ]] || { echo "scripts.rs${rev:+ at $rev} has no script ending in $name.lua" >&2; return 1; }
  files=$(echo "$line" | grep -o '"[a-z_]*\.lua"' | tr -d '"')
  if [[ $line == batched!* ]]; then
    local shape
    shape=$(echo "$line" | grep -o '([0-9]*, [0-9]*)' | tr -d '()' | tr '\n' ' ' | awk '{ printf "%s %s %s %s", $1, $2, $3, $4 }' | tr -d ',')
    show scripts/clock.lua
    if show src/scripts.rs | grep -q 'scripts/run.lua'; then
      show scripts/run.lua
      call='local function decide_call(k, a, nkeys'
      show src/scripts.rs | grep -q 'decide_call(k, a, nkeys, r)' && call+=', r'
      call+=')'
    elif show src/scripts.rs | grep -q 'local KEYS, ARGV, answer = KEYS, ARGV, {}'; then
      printf 'local KEYS, ARGV, answer = KEYS, ARGV, {}\n'  # offsets, before run.lua
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
  [[ $1 != reference/* ]] && is_batched_text "$@"
}
is_batched_text() {
  [[ $(batched_body "$@") == *$'\nlocal function decide_call('* ]]
}
call_words() {
  local name=$1 rev=${2:-} now=$3 run=true
  local -a params counter
  show_at "$rev" src/scripts.rs | grep -q 'scripts/run.lua' || run=false
  # A counter's words: limit, window, then hits and role, or the role with its hits in.
  case $(script_text counters "$rev" | sed -n 's/^local ARGS, ARGS_PER_KEY, REPLY, REPLY_PER_KEY = [0-9]*, \([0-9]*\),.*/\1/p') in
    7 | "") counter=(1000000000000 60000000 1 1 0 0 0) ;;  # "": before batches
    4) counter=(1000000000000 60000000 1 1) ;;
    *) counter=(1000000000000 60000000 1) ;;
  esac
  case $name in
    token_bucket) params=(10 1000000000) ;;
    fixed_window | weighted_window) params=(1000000000000 60000000) ;;
    sliding_log) params=(100000000 60000000) ;;
    counters) ;;
    *) echo "call_words: no call of $name" >&2; return 1 ;;
  esac
  if [[ $name == counters ]]; then
    if $run; then printf '%s\n' 1 "${counter[@]}"; else printf '%s\n' "$now" 1 0 "${counter[@]}"; fi
  else
    if $run; then printf '%s\n' 1 1 0 "${params[@]}"; else printf '%s\n' "$now" 1 1 0 0 "${params[@]}"; fi
  fi
}
run_words() { # NAME REV NOW CALLS -> what a batched run takes after its calls (and key counts)
  if is_batched "$1" "${2:-}" && show_at "${2:-}" src/scripts.rs | grep -q 'scripts/run.lua'; then
    if show_at "${2:-}" scripts/run.lua | grep -q 'return -calls, 4'; then
      # The clock's words only on a passed-in now, and then the number of calls negated.
      if [[ -z $3 ]]; then echo "$4"; else printf '%s\n' "$3" 0 17592186044416 "-$4"; fi
      return
    fi
    printf '%s\n' "$3" 0
    # The expiry shift (fixed_lib.lua's fixed_clock), since fixed windows are string keys: 0 on
    # Redis TIME; on a passed-in now, 2^44 (a manual clock's: RedisTime's FAR_SHIFT_MS).
    if show_at "${2:-}" scripts/run.lua | grep -q 'SHIFT'; then
      if [[ -z $3 ]]; then echo 0; else echo 17592186044416; fi
    fi
  fi
  echo "$4"
}
