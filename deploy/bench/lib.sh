# lib.sh: what peer.sh and profile.sh share, sourced by both.

# bench_defaults sets what bench_args may change, but for the streams.
bench_defaults() {
	baton=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../../bin/baton
	threads=$(nproc)
	in_len=128
	out_len=128
	per=2
	rounds=1
	outdir=
}

# bench_args parses [-b BATON] [-t THREADS] [-s STREAMS] [-i INPUT_LEN]
# [-o OUTPUT_LEN] [-n PROMPTS_PER_STREAM] [-r ROUNDS] [-d OUTDIR] into
# the globals of those names, over bench_defaults and the caller's streams; the caller
# then shifts $((OPTIND - 1)) and calls its usage on a bad option.
bench_args() {
	local opt
	while getopts "b:t:s:i:o:n:r:d:h" opt; do
		case $opt in
		b) baton=$OPTARG ;;
		t) threads=$OPTARG ;;
		s) streams=$OPTARG ;;
		i) in_len=$OPTARG ;;
		o) out_len=$OPTARG ;;
		n) per=$OPTARG ;;
		r) rounds=$OPTARG ;;
		d) outdir=$OPTARG ;;
		*) usage; exit 2 ;;
		esac
	done
}

# wait_up PID PORT: until the server answers /health (0), or its process
# is gone or ten minutes have passed (1).
wait_up() {
	local _
	for _ in $(seq 1 1200); do
		kill -0 "$1" 2>/dev/null || return 1
		curl -fsS -m 2 "http://127.0.0.1:$2/health" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	return 1
}

# needs TOOL...: exits 2 naming the first tool not on PATH.
needs() {
	local t
	for t in "$@"; do
		command -v "$t" >/dev/null || { echo "$(basename "$0"): needs $t" >&2; exit 2; }
	done
}
