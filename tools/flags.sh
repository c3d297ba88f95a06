# flags.sh: how every LBCC shell script reads its command line (the bash twin of tools/cli.h).
# Sourced, not run:
#
#   source "$(dirname "$0")/flags.sh"            (python/install: ../tools/flags.sh)
#   flags_value NAME DEFAULT "help"               --NAME VALUE / --NAME=VALUE  -> $FLAG_NAME
#   flags_bool NAME "help"                        --NAME / --noNAME            -> $FLAG_NAME (0/1)
#   flags_list NAME "help"                        repeatable --NAME=VALUE      -> ${FLAG_NAME[@]}
#   flags_positional "WORDS" "help"               what the positional arguments are (for --help)
#   flags_parse "$@"                              -> ${FLAGS_ARGS[@]}: the positional arguments
#
# flags_parse: -h/--help prints the script's header comment (its second line up to the first
# line that is not a comment) and its flags, then exits 0 before the script does anything else;
# an unknown flag or a missing value prints "SCRIPT: unknown flag --x (see --help)" and exits 2;
# "--" ends the flags (the rest are positional). Flag names use underscores; dashes typed on the
# command line are read as underscores.

# The script's path for --help. Scripts cd to the repository root before sourcing this, so a
# relative $0 is resolved against the folder they were started from ($OLDPWD after that cd).
if [[ -z ${FLAGS_SCRIPT:-} ]]; then
  FLAGS_SCRIPT=$0
  [[ $FLAGS_SCRIPT == /* || -r $FLAGS_SCRIPT ]] || FLAGS_SCRIPT=${OLDPWD:-.}/$0
fi
_flags_names=()
_flags_kinds=()
_flags_helps=()
_flags_positional=""

flags_value() {
  _flags_names+=("$1"); _flags_kinds+=(value); _flags_helps+=("$3 (default: ${2:-none})")
  printf -v "FLAG_$1" '%s' "$2"
}

flags_bool() {
  _flags_names+=("$1"); _flags_kinds+=(bool); _flags_helps+=("$2")
  printf -v "FLAG_$1" '%s' 0
}

flags_list() {
  _flags_names+=("$1"); _flags_kinds+=(list); _flags_helps+=("$2 (repeatable)")
  eval "FLAG_$1=()"
}

flags_positional() {
  _flags_positional="  $1: $2"
}

_flags_die() {
  echo "$(basename "$FLAGS_SCRIPT"): $* (see --help)" >&2
  exit 2
}

flags_help() {
  sed -n '2,/^[^#]/p' "$FLAGS_SCRIPT" | grep '^#' | sed 's/^# \{0,1\}//'
  local i
  if ((${#_flags_names[@]})); then
    echo
    echo "flags:"
    for i in "${!_flags_names[@]}"; do
      case ${_flags_kinds[$i]} in
        bool) printf '  --%s\n      %s\n' "${_flags_names[$i]}" "${_flags_helps[$i]}" ;;
        *) printf '  --%s=VALUE\n      %s\n' "${_flags_names[$i]}" "${_flags_helps[$i]}" ;;
      esac
    done
  fi
  echo "  -h, --help"
  echo "      print this text and exit"
  [[ -n $_flags_positional ]] && { echo "positional:"; echo "$_flags_positional"; }
  return 0
}

_flags_kind() {
  local i
  for i in "${!_flags_names[@]}"; do
    if [[ ${_flags_names[$i]} == "$1" ]]; then
      echo "${_flags_kinds[$i]}"
      return 0
    fi
  done
  return 1
}

flags_parse() {
  FLAGS_ARGS=()
  local arg name value kind has_value
  # --help anywhere wins, before any other flag is acted on.
  for arg in "$@"; do
    [[ $arg == -- ]] && break
    if [[ $arg == -h || $arg == --help ]]; then
      flags_help
      exit 0
    fi
  done
  while (($#)); do
    arg=$1
    shift
    case $arg in
      --) FLAGS_ARGS+=("$@"); return 0 ;;
      --*) ;;
      -?*) _flags_die "unknown flag $arg" ;;
      *) FLAGS_ARGS+=("$arg"); continue ;;
    esac
    name=${arg#--}
    has_value=0
    if [[ $name == *=* ]]; then
      value=${name#*=}
      name=${name%%=*}
      has_value=1
    fi
    name=${name//-/_}
    if ! kind=$(_flags_kind "$name"); then
      if [[ $name == no* && $has_value == 0 ]] && [[ $(_flags_kind "${name#no}") == bool ]]; then
        printf -v "FLAG_${name#no}" '%s' 0
        continue
      fi
      _flags_die "unknown flag ${arg%%=*}"
    fi
    case $kind in
      bool)
        ((has_value)) && _flags_die "--$name takes no value"
        printf -v "FLAG_$name" '%s' 1
        ;;
      value | list)
        if ((!has_value)); then
          (($#)) || _flags_die "--$name needs a value"
          value=$1
          shift
        fi
        if [[ $kind == value ]]; then
          printf -v "FLAG_$name" '%s' "$value"
        else
          eval "FLAG_$name+=(\"\$value\")"
        fi
        ;;
    esac
  done
  return 0
}
