package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Role sets of serve's flags.
var (
	allRoles     = []string{"standalone", "prefill", "decode", "router"}
	engineRoles  = []string{"standalone", "prefill", "decode"}
	workerRoles  = []string{"prefill", "decode"}
	clusterRoles = []string{"router", "prefill", "decode"}
)

// flagRoles says on which roles each serve flag does something; the
// README's table of flags lists the same roles (readme_test checks it). A
// flag given to a role it does nothing on is refused, so that a setting
// nobody enforces is not mistaken for one: the router holds no model, KV
// pool or batch, and standalone no internal plane. The two worker roles
// accept each other's flags, so that one set of worker arguments serves
// both.
var flagRoles = map[string][]string{
	"role": allRoles, "model": allRoles, "host": allRoles, "port": allRoles, "tokenizer": allRoles,
	"served-model-name": allRoles, "api-key": allRoles, "metrics-require-key": allRoles,
	"request-read-timeout": allRoles, "shutdown-timeout": allRoles,
	"http-idle-timeout": allRoles, "max-connections": allRoles,
	"otlp-traces-endpoint": allRoles, "otlp-traces-sample-ratio": allRoles,
	"allow-special-tokens-in-prompt": {"standalone", "router"},

	"chat-template":    {"standalone", "router"},
	"tool-call-parser": {"standalone", "router"}, "reasoning-parser": {"standalone", "router"},
	"allowed-origins": {"standalone", "router"}, "allowed-methods": {"standalone", "router"},
	"allowed-headers": {"standalone", "router"}, "allow-credentials": {"standalone", "router"},

	"context-length": engineRoles, "page-size": engineRoles, "max-total-tokens": engineRoles,
	"kv-cache-memory": engineRoles, "mem-fraction-static": engineRoles, "max-running-requests": engineRoles,
	"load-format": engineRoles, "mmap": engineRoles, "dummy-dtype": engineRoles, "kv-poison": engineRoles, "kv-cache-dtype": engineRoles,
	"cuda-graph-max-bs": engineRoles, "disable-cuda-graph": engineRoles,
	"strict-capacity": engineRoles, "device": engineRoles, "threads": engineRoles,
	"chunked-prefill-size":  engineRoles,
	"preempt-after":         {"standalone"},
	"speculative-algorithm": {"standalone", "decode"}, "speculative-num-draft-tokens": {"standalone", "decode"},
	"speculative-num-steps": {"standalone", "decode"}, "speculative-draft-model-path": {"standalone", "decode"},
	"speculative-draft-load-format": {"standalone", "decode"}, "speculative-disable-by-batch-size": {"standalone", "decode"},
	"max-queued-requests": {"standalone", "prefill", "router"},
	"queue-timeout":       {"router"}, "max-migrations": {"router"}, "disagg-prefill-threshold": {"router"},
	"planner": {"router"}, "planner-interval": {"router"}, "ttft-slo": {"router"}, "itl-slo": {"router"},
	"planner-capacity": {"router"},

	"disaggregation-mode":             {"prefill", "decode", "standalone"},
	"disaggregation-transfer-backend": workerRoles, "transport": workerRoles,
	"rdma-device": workerRoles, "disaggregation-ib-device": workerRoles,
	"advertise-host": workerRoles, "grpc-port": workerRoles, "insecure-internal": workerRoles,
	"transfer-port": {"decode"}, "handoff-timeout": {"decode"}, "drain-grace": {"decode"}, "cuda-ipc-arena": {"prefill"}, "ucx-kv-buffer": {"decode"},
	"max-reservations-per-peer": {"decode"}, "max-pages-per-peer": {"decode"},

	"internal-tls-cert": clusterRoles, "internal-tls-key": clusterRoles, "internal-tls-ca": clusterRoles,
	"cluster-secret-file": clusterRoles,

	"prefill": {"router"}, "decode": {"router"}, "policy": {"router"},
	"cache-threshold": {"router"}, "balance-abs-threshold": {"router"}, "balance-rel-threshold": {"router"},

	"disable-radix-cache": {"standalone", "prefill"}, "prefix-cache-scope": {"standalone", "router"},
	"disaggregation-decode-enable-radix-cache": {"decode"},
	"hicache-size": engineRoles, "hicache-write-policy": engineRoles, "hicache-storage-backend": engineRoles,
	"hicache-storage-dir": engineRoles, "hicache-storage-size": engineRoles, "hicache-storage-key-file": engineRoles,

	"spec-guard": {"standalone", "decode"}, "spec-guard-min-tokens": {"standalone", "decode"},
	"spec-guard-min-accept-length": {"standalone", "decode"}, "spec-guard-max-accept-rate": {"standalone", "decode"},

	"dry-run": allRoles, "cpu-profile": allRoles,
}

// flagsForRole refuses a flag set (on the command line or through its
// BATON_* variable) that does nothing on role.
func flagsForRole(fs *pflag.FlagSet, role string) error {
	var bad []string
	fs.Visit(func(f *pflag.Flag) {
		roles, known := flagRoles[f.Name]
		if !known || slices.Contains(roles, role) {
			return
		}
		if slices.Contains(workerRoles, role) && (slices.Contains(roles, "prefill") || slices.Contains(roles, "decode")) {
			return
		}
		bad = append(bad, fmt.Sprintf("--%s (%s only)", f.Name, strings.Join(roles, ", ")))
	})
	if len(bad) > 0 {
		return fmt.Errorf("--role %s: %s do nothing on this role; leave them out", role, strings.Join(bad, "; "))
	}
	return nil
}
