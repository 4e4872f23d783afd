package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/batonlm/baton/internal/auth"
)

func keysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Make the role key files of the internal plane's secret mode",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(keysDeriveCmd())
	return cmd
}

func keysDeriveCmd() *cobra.Command {
	var master, out string
	var roles []string
	cmd := &cobra.Command{
		Use:   "derive --master FILE --role ROLE --out DIR",
		Short: "Derive the key file a role's members mount from the cluster master secret",
		Long: `Writes DIR/<role>.key for each --role (router, prefill, decode, or all): that role's
private key and every role's public key, derived from the cluster master secret in
--master (32 bytes or more, e.g. head -c 48 /dev/urandom | base64). Give each member
its role's file with --cluster-secret-file: a member then signs as its own role only,
so a prefill pod cannot act as the router or as decode. The master stays with whoever
deploys; deriving again gives the same files, so lost ones can be made again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if master == "" || out == "" || len(roles) == 0 {
				return fmt.Errorf("keys derive needs --master, --role and --out")
			}
			want, err := keyRoles(roles)
			if err != nil {
				return err
			}
			secret, err := auth.ReadMaster(master, "--master")
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return err
			}
			for _, r := range want {
				b, err := auth.RoleKeyFile(secret, r)
				if err != nil {
					return err
				}
				path := filepath.Join(out, string(r)+".key")
				if err := writePrivate(path, b); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s key %s\n", path, r, auth.RoleKeyID(secret, r))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&master, "master", "", "file holding the cluster master secret")
	cmd.Flags().StringSliceVar(&roles, "role", nil, "role to derive the key of: router, prefill, decode or all (repeatable)")
	cmd.Flags().StringVar(&out, "out", "", "directory to write <role>.key into (made 0700 if missing)")
	return cmd
}

func keyRoles(names []string) ([]auth.Role, error) {
	var out []auth.Role
	for _, n := range names {
		if n == "all" {
			return auth.Roles, nil
		}
		r, err := auth.ParseRole(n)
		if err != nil {
			return nil, fmt.Errorf("--role: %w", err)
		}
		out = append(out, r)
	}
	return out, nil
}

// writePrivate replaces path with b, readable by its owner only; the
// rename keeps a reader from ever seeing half a key.
func writePrivate(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
