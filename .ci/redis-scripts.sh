# Sourced by .ci/redis-instructions and .ci/redis-cpu: a script's text as
# crates/tollgate-redis/src/scripts.rs assembles it, its files read from scripts.rs itself (so the
# measurements follow what the crate runs), in the working tree or at a commit.
#
#   script_text NAME [REV]   clock.lua, then the files scripts.rs's `script!` of NAME.lua lists
#                            (e.g. reset: reset.lua); for a `batched!` one, its libraries, its
#                            body wrapped as decide_call with its shape, then batch.lua;
#                            a reference (reference/NAME.lua, the least work a decision needs)
#                            alone, always from the working tree.
#   is_batched NAME [REV]    true when scripts.rs runs NAME.lua in batches (its calls' ARGV then
#                            start with their key count).
redis_scripts_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/crates/tollgate-redis"
script_text() {
  local name=$1 rev=${2:-} f files
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
    for f in $files; do [[ $f == "$name.lua" ]] || show "scripts/$f"; done
    read -r a ak r rk <<<"$shape"
    printf 'local ARGS, ARGS_PER_KEY, REPLY, REPLY_PER_KEY = %s, %s, %s, %s\nlocal function decide_call(KEYS, ARGV)\n' "$a" "$ak" "$r" "$rk"
    show "scripts/$name.lua"
    printf 'end\n'
    show scripts/batch.lua
    return
  fi
  for f in clock.lua $files; do show "scripts/$f"; done
}
is_batched() {
  [[ $(script_text "$@") == *$'\nlocal function decide_call(KEYS, ARGV)\n'* ]]
}
