package auth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
)

// Roles lists every role, in the order key files name them.
var Roles = []Role{RoleRouter, RolePrefill, RoleDecode}

// ParseRole reads a role's name.
func ParseRole(s string) (Role, error) {
	if r := Role(s); r.valid() {
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q (router, prefill, decode)", s)
}

// roleKeyHeader opens every role key file. A master secret is random bytes
// or their base64, so it never starts with it.
const roleKeyHeader = "baton-role-key v1"

// roleKeySalt versions the derivation: a new scheme gets a new salt, and
// keys of the two can never be confused.
var roleKeySalt = []byte("baton role key v1")

// keyring is what a secret-mode member signs and verifies with.
type keyring struct {
	sign   ed25519.PrivateKey         // this member's role's key
	public map[Role]ed25519.PublicKey // every role's, to verify callers
	ids    map[Role]string            // KeyID of each public key
	master bool                       // derived from the master: this member could sign as any role
}

// roleSeed derives role's Ed25519 seed from the cluster master secret:
// HKDF-SHA256, info = the role. The seed is the whole private key, so a
// member given one role's seed can sign as that role only.
func roleSeed(master []byte, r Role) []byte {
	k, err := hkdf.Key(sha256.New, master, roleKeySalt, string(r), ed25519.SeedSize)
	if err != nil {
		panic("auth: hkdf: " + err.Error()) // only for output lengths HKDF cannot give
	}
	return k
}

func newKeyring(sign ed25519.PrivateKey, public map[Role]ed25519.PublicKey, master bool) *keyring {
	k := &keyring{sign: sign, public: public, ids: map[Role]string{}, master: master}
	for r, pub := range public {
		k.ids[r] = KeyID(pub)
	}
	return k
}

// masterKeyring is what a member given the master secret holds: every
// role's key, of which it signs with its own.
func masterKeyring(master []byte, self Role) *keyring {
	public := map[Role]ed25519.PublicKey{}
	var sign ed25519.PrivateKey
	for _, r := range Roles {
		priv := ed25519.NewKeyFromSeed(roleSeed(master, r))
		public[r] = priv.Public().(ed25519.PublicKey)
		if r == self {
			sign = priv
		}
	}
	return newKeyring(sign, public, true)
}

// KeyID names a public key in logs and quota keys: the first 12 hex digits
// of its SHA-256.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:6])
}

// RoleKeyID is the ID (KeyID) of role's public key derived from master:
// what a member of role shows in its peers' logs and quotas.
func RoleKeyID(master []byte, role Role) string {
	return KeyID(ed25519.NewKeyFromSeed(roleSeed(master, role)).Public().(ed25519.PublicKey))
}

// RoleKeyFile is the file a member of role mounts in place of the master
// secret: role's private key and every role's public key. Derivation is
// deterministic, so deriving again gives the same file.
func RoleKeyFile(master []byte, role Role) ([]byte, error) {
	if !role.valid() {
		return nil, fmt.Errorf("auth: unknown role %q", role)
	}
	if len(master) < minSecretLen {
		return nil, fmt.Errorf("auth: the master secret is %d bytes, want at least %d", len(master), minSecretLen)
	}
	var b bytes.Buffer
	enc := base64.StdEncoding
	fmt.Fprintf(&b, "%s\n", roleKeyHeader)
	fmt.Fprintf(&b, "# The %s key of a baton cluster (baton keys derive). Mount it on %s members only:\n", role, role)
	fmt.Fprintf(&b, "# whoever reads it can act as %s on the internal plane.\n", role)
	fmt.Fprintf(&b, "role %s\n", role)
	fmt.Fprintf(&b, "private %s\n", enc.EncodeToString(roleSeed(master, role)))
	for _, r := range Roles {
		pub := ed25519.NewKeyFromSeed(roleSeed(master, r)).Public().(ed25519.PublicKey)
		fmt.Fprintf(&b, "public %s %s\n", r, enc.EncodeToString(pub))
	}
	return b.Bytes(), nil
}

// isRoleKeyFile tells a role key file from a master secret.
func isRoleKeyFile(b []byte) bool {
	return bytes.HasPrefix(b, []byte(roleKeyHeader+"\n")) || bytes.HasPrefix(b, []byte(roleKeyHeader+"\r\n"))
}

// parseRoleKey reads a role key file for a member of role self. It refuses
// a file for another role: that member would sign calls its peers refuse,
// or, worse, act as a role it was not deployed as.
func parseRoleKey(path string, b []byte, self Role) (*keyring, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("auth: %s %s: "+format, append([]any{FlagClusterSecret, path}, args...)...)
	}
	var role Role
	var seed []byte
	public := map[Role]ed25519.PublicKey{}
	lines := strings.Split(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n")
	for i, line := range lines[1:] {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "role" && role == "":
			r, err := ParseRole(f[1])
			if err != nil {
				return nil, bad("line %d: %v", i+2, err)
			}
			role = r
		case len(f) == 2 && f[0] == "private" && seed == nil:
			s, err := base64.StdEncoding.DecodeString(f[1])
			if err != nil || len(s) != ed25519.SeedSize {
				return nil, bad("line %d: the private key is not %d bytes of base64", i+2, ed25519.SeedSize)
			}
			seed = s
		case len(f) == 3 && f[0] == "public":
			r, err := ParseRole(f[1])
			if err != nil {
				return nil, bad("line %d: %v", i+2, err)
			}
			p, err := base64.StdEncoding.DecodeString(f[2])
			if err != nil || len(p) != ed25519.PublicKeySize {
				return nil, bad("line %d: the %s public key is not %d bytes of base64", i+2, r, ed25519.PublicKeySize)
			}
			if _, dup := public[r]; dup {
				return nil, bad("line %d: a second %s public key", i+2, r)
			}
			public[r] = p
		default:
			return nil, bad("line %d: not a line of a role key file (want `role R`, `private KEY` or `public R KEY`)", i+2)
		}
	}
	switch {
	case role == "" || seed == nil:
		return nil, bad("incomplete role key file (no role or no private key); make it with `baton keys derive`")
	case role != self:
		return nil, bad("holds the %s key but this process is %s; mount the %s key (baton keys derive --role %s)", role, self, self, self)
	}
	for _, r := range Roles {
		if public[r] == nil {
			return nil, bad("no %s public key", r)
		}
	}
	priv := ed25519.NewKeyFromSeed(seed)
	if !priv.Public().(ed25519.PublicKey).Equal(public[role]) {
		return nil, bad("the private key does not match the %s public key; derive the file again", role)
	}
	return newKeyring(priv, public, false), nil
}

// loadSecretFile reads --cluster-secret-file: a role key file, or the
// master secret itself (every role's key, for one-file set-ups).
func loadSecretFile(path string, self Role) (*keyring, error) {
	b, err := readLimited(path, FlagClusterSecret)
	if err != nil {
		return nil, err
	}
	if isRoleKeyFile(b) {
		return parseRoleKey(path, b, self)
	}
	master, err := checkMaster(b, path, FlagClusterSecret)
	if err != nil {
		return nil, err
	}
	return masterKeyring(master, self), nil
}

// ReadMaster reads a cluster master secret file, as --cluster-secret-file
// does; flag names the option that gave path, for the errors.
func ReadMaster(path, flag string) ([]byte, error) {
	b, err := readLimited(path, flag)
	if err != nil {
		return nil, err
	}
	if isRoleKeyFile(b) {
		return nil, fmt.Errorf("auth: %s %s is a role key file, not the master secret", flag, path)
	}
	return checkMaster(b, path, flag)
}

func readLimited(path, flag string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", flag, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", flag, err)
	}
	if len(b) > maxSecretFileBytes {
		return nil, fmt.Errorf("auth: %s %s: larger than %d bytes; is it the right file?", flag, path, maxSecretFileBytes)
	}
	return b, nil
}

func checkMaster(b []byte, path, flag string) ([]byte, error) {
	// Editors and `echo` leave a newline; it must not make two members disagree.
	b = []byte(strings.TrimRight(string(b), " \t\r\n"))
	if len(b) < minSecretLen {
		return nil, fmt.Errorf("auth: %s %s: the secret is %d bytes, want at least %d (e.g. `head -c 32 /dev/urandom | base64`)",
			flag, path, len(b), minSecretLen)
	}
	return b, nil
}
