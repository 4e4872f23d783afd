package main

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/batonlm/baton/internal/check"
)

func checkCmd() *cobra.Command {
	var o check.Options
	cmd := &cobra.Command{
		Use:   "check --router URL",
		Short: "Run the isolation gates against a live deployment and check its internal plane",
		Long: `Runs the four acceptance checks (pool/context, reject/admission, transfer/read,
lifetime/ownership) against a live deployment through its router and its workers' HTTP
endpoints, prints one row per gate with its evidence, and exits non-zero if any fails. It
sends a few small requests and leaves the deployment as it found it. The workers' HTTP ports
must be reachable from where it runs.

A fifth row, "prefix cache/tenants", sends one new prompt as two tenants (two cache_salt
values): the second must read 0 cached tokens, and the first again must answer the same (with
a cache hit when the prefix cache is on).

A last row, "internal plane", says how the router and each worker authenticate each other
(internal_auth in the router's /server_info): mtls, secret, or none on loopback pass; a member
started with --insecure-internal, one that does not say, or one in another mode than the
router's fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags()); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			rep, err := check.Run(ctx, o)
			if err != nil {
				return err
			}
			rep.Print(cmd.OutOrStdout())
			if !rep.OK() {
				return errors.New("isolation check failed")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Router, "router", "http://127.0.0.1:8000", "the router's base URL")
	cmd.Flags().StringVar(&o.APIKey, "api-key", "", "API key, when the deployment requires one")
	cmd.Flags().DurationVar(&o.Settle, "settle", 15*time.Second, "how long pages may take to come back after the abort probe")
	return cmd
}
