package roles

import (
	"testing"

	"google.golang.org/grpc"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
)

// Every RPC of the control plane names the roles that may call it: one
// missing from callers would be refused to everyone, or, worse, an
// oversight in a policy that allowed it.
func TestEveryRPCHasCallers(t *testing.T) {
	for _, sd := range []grpc.ServiceDesc{pdv1.Decode_ServiceDesc, pdv1.Prefill_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, n := range names {
			if len(callers["/"+sd.ServiceName+"/"+n]) == 0 {
				t.Errorf("%s/%s has no callers", sd.ServiceName, n)
			}
		}
	}
	if got := callers["/baton.pd.v1.Prefill/Tokenizer"]; len(got) != 1 || got[0] != "router" {
		t.Errorf("Prefill/Tokenizer callers %v: only the router learns the tokenizer", got)
	}
}
