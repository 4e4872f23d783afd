package tracing

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// DialOptions carry the trace context of each call's ctx to the worker
// in the call's metadata (traceparent, tracestate). None when tracing is
// off.
func DialOptions() []grpc.DialOption {
	if !Enabled() {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(handler{client: true})}
}

// ServerOptions read the caller's trace context from each call's
// metadata into the handler's ctx, so that the worker's spans are its
// children. None when tracing is off.
func ServerOptions() []grpc.ServerOption {
	if !Enabled() {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(handler{})}
}

// handler is a gRPC stats handler that only moves the trace context: it
// makes no spans of its own (the roles make the ones that mean something).
type handler struct{ client bool }

func (h handler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	st := cur.Load()
	if st == nil {
		return ctx
	}
	if h.client {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return ctx
		}
		c := propagation.MapCarrier{}
		st.prop.Inject(ctx, c)
		kv := make([]string, 0, 2*len(c))
		for k, v := range c {
			kv = append(kv, k, v)
		}
		return metadata.AppendToOutgoingContext(ctx, kv...)
	}
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	return st.prop.Extract(ctx, mdCarrier(md))
}

func (handler) HandleRPC(context.Context, stats.RPCStats) {}

func (handler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (handler) HandleConn(context.Context, stats.ConnStats) {}

// mdCarrier reads gRPC metadata as a propagation carrier.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
