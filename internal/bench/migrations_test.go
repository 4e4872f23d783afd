package bench

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The migrations are the router counters' growth by reason, and the stall
// of each is told by the requests with the longest gap between tokens,
// less the median inter-token latency.
func TestMigrationFigures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# HELP baton_router_migrations_total x\nbaton_router_migrations_total{reason=\"decode_gone\"} 3\nbaton_router_migrations_total{model=\"m\",reason=\"drain\"} 1\nbaton_other 9\n"))
	}))
	defer srv.Close()
	after, ok := migrationCounters(context.Background(), srv.Client(), srv.URL, "")
	if !ok || after["decode_gone"] != 3 || after["drain"] != 1 || len(after) != 2 {
		t.Fatalf("counters %v %v", after, ok)
	}
	ms := time.Millisecond
	results := []result{
		{itl: []time.Duration{10 * ms, 10 * ms, 510 * ms}},
		{itl: []time.Duration{10 * ms, 210 * ms, 10 * ms}},
		{itl: []time.Duration{10 * ms, 20 * ms}},
		{itl: []time.Duration{900 * ms}, err: errors.New("failed")},
	}
	rep := &Report{ITL: Stats{P50: 10}}
	rep.migrationFigures(map[string]float64{"decode_gone": 2}, after, results)
	if rep.MigrationsTotal != 2 || rep.Migrations["decode_gone"] != 1 || rep.Migrations["drain"] != 1 {
		t.Fatalf("migrations %v (%d)", rep.Migrations, rep.MigrationsTotal)
	}
	// The two longest gaps (500 and 200 ms past the median) are the two
	// migrated requests'; the failed request's is not counted.
	if st := rep.MigrationStall; st.N != 2 || st.Max != 500 || st.P50 != 350 {
		t.Fatalf("stall %+v, want 2 stalls, the longest 500 ms, p50 350", st)
	}
}
