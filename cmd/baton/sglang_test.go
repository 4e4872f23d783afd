package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// SGLang's PD flag names set baton's own flags.
func TestSGLangFlagNames(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		out  string // dry run's line
		err  string
	}{
		{args: []string{"--disaggregation-mode", "prefill"}, out: "prefill configuration is valid"},
		{args: []string{"--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "tcp"}, out: "decode configuration is valid"},
		{args: []string{"--disaggregation-mode", "null"}, out: "standalone configuration is valid"},
		{args: []string{"--disaggregation-mode", "router"}, err: "unknown --disaggregation-mode"},
		{args: []string{"--role", "decode", "--disaggregation-mode", "prefill"}, err: "give one of them"},
		{args: []string{"--role", "prefill", "--disaggregation-transfer-backend", "mooncake"}, err: `unknown --transport "mooncake"`},
		{args: []string{"--disaggregation-mode", "decode"}, env: map[string]string{"BATON_ROLE": "prefill"}, out: "decode configuration is valid"},
		{args: []string{"--role", "prefill", "--disaggregation-transfer-backend", "cuda-ipc", "--device", "cuda"}, out: "prefill configuration is valid"},
		{args: []string{"--role", "decode", "--transport", "cuda-ipc", "--device", "cpu"}, err: "needs --device cuda"},
		{args: []string{"--role", "prefill", "--transport", "cuda-ipc", "--device", "cuda", "--cuda-ipc-arena", "lots"}, err: "--cuda-ipc-arena"},
		{args: []string{"--role", "decode", "--ucx-kv-buffer", "gpu"}, err: `--ucx-kv-buffer "gpu": auto or host`},
		{args: []string{"--role", "decode", "--ucx-kv-buffer", "host"}, out: "decode configuration is valid"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			dryRun(t, c.args, c.err, c.out)
		})
	}
	cmd := serveCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetArgs([]string{"--dry-run", "--role", "decode", "--disaggregation-ib-device", "mlx5_0,mlx5_1"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if got, _ := cmd.Flags().GetStringSlice("rdma-device"); !slices.Equal(got, []string{"mlx5_0", "mlx5_1"}) {
		t.Fatalf("--disaggregation-ib-device mlx5_0,mlx5_1 gave --rdma-device %v", got)
	}
}
