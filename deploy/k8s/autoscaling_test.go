package k8s

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// plannerMetric is what internal/planner/live exports and the HPAs read.
const plannerMetric = "baton_planner_desired_replicas"

// TestAutoscalingOverlay builds overlays/autoscaling and holds its HPAs to
// what the router exports and the Deployments they scale: strictly decoded,
// one per worker pool, on the planner's metric for that role, a replica
// count equal to the metric's value, a scale-down that waits and goes one
// at a time, Deployments that leave the count to the HPA and drain before
// they go, and a router that runs the planner.
func TestAutoscalingOverlay(t *testing.T) {
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "overlays/autoscaling")
	if err != nil {
		t.Fatal(err)
	}
	hpas := map[string]*autoscalingv2.HorizontalPodAutoscaler{}
	deps := map[string]*appsv1.Deployment{}
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		switch r.GetKind() {
		case "HorizontalPodAutoscaler":
			h := &autoscalingv2.HorizontalPodAutoscaler{}
			if err := yaml.UnmarshalStrict(y, h); err != nil {
				t.Fatalf("%s: %v", r.GetName(), err)
			}
			if h.APIVersion != "autoscaling/v2" {
				t.Errorf("%s: apiVersion %s", h.Name, h.APIVersion)
			}
			hpas[h.Spec.ScaleTargetRef.Name] = h
		case "Deployment":
			d := &appsv1.Deployment{}
			if err := yaml.UnmarshalStrict(y, d); err != nil {
				t.Fatalf("%s: %v", r.GetName(), err)
			}
			deps[d.Name] = d
		}
	}
	for _, role := range []string{"prefill", "decode"} {
		name := "baton-" + role
		h, d := hpas[name], deps[name]
		if h == nil || d == nil {
			t.Fatalf("%s: HPA %v, Deployment %v", name, h != nil, d != nil)
		}
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.APIVersion != "apps/v1" {
			t.Errorf("%s scales %+v", name, h.Spec.ScaleTargetRef)
		}
		if len(h.Spec.Metrics) != 1 || h.Spec.Metrics[0].External == nil {
			t.Fatalf("%s: want one External metric, got %+v", name, h.Spec.Metrics)
		}
		m := h.Spec.Metrics[0].External
		if m.Metric.Name != plannerMetric || m.Metric.Selector == nil || m.Metric.Selector.MatchLabels["role"] != role {
			t.Errorf("%s reads %s %v, want %s{role=%s}", name, m.Metric.Name, m.Metric.Selector, plannerMetric, role)
		}
		if m.Target.Type != autoscalingv2.AverageValueMetricType || m.Target.AverageValue == nil || m.Target.AverageValue.String() != "1" {
			t.Errorf("%s: target %+v; an AverageValue of 1 makes the replicas the planner's count", name, m.Target)
		}
		if h.Spec.Behavior == nil {
			t.Fatalf("%s has no behavior", name)
		}
		sd := h.Spec.Behavior.ScaleDown
		if sd == nil || sd.StabilizationWindowSeconds == nil || *sd.StabilizationWindowSeconds < 300 ||
			len(sd.Policies) != 1 || sd.Policies[0].Type != autoscalingv2.PodsScalingPolicy || sd.Policies[0].Value != 1 {
			t.Errorf("%s: scale-down %+v, want a window of 5 minutes or more and one pod at a time", name, sd)
		}
		if d.Spec.Replicas != nil {
			t.Errorf("%s sets replicas %d, which each apply would put back over the HPA's", name, *d.Spec.Replicas)
		}
		// Drained before it goes: a preStop hook, and a grace period
		// longer than the shutdown timeout the drain may take.
		c, err := batonContainer(d)
		if err != nil {
			t.Fatal(err)
		}
		f, err := flags(c.Args)
		if err != nil {
			t.Fatal(err)
		}
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
			t.Errorf("%s has no preStop hook", name)
		}
		if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || last(f, "shutdown-timeout", "") == "" ||
			parseSeconds(t, last(f, "shutdown-timeout", "")) >= *g {
			t.Errorf("%s: grace period %v does not cover --shutdown-timeout %s", name, g, last(f, "shutdown-timeout", ""))
		}
	}
	r := deps["baton-router"]
	c, err := batonContainer(r)
	if err != nil {
		t.Fatal(err)
	}
	f, err := flags(c.Args)
	if err != nil {
		t.Fatal(err)
	}
	if last(f, "planner", "") != "true" || !slices.Contains(c.Args, "--ttft-slo=500ms") {
		t.Errorf("the router does not run the planner: %q", c.Args)
	}
}

// The adapter's rule serves the metric the HPAs name.
func TestPrometheusAdapterRule(t *testing.T) {
	b, err := os.ReadFile("overlays/autoscaling/prometheus-adapter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	if err := yaml.UnmarshalStrict(b, cm); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ExternalRules []struct {
			SeriesQuery string `json:"seriesQuery"`
			Resources   struct {
				Overrides map[string]struct {
					Resource string `json:"resource"`
				} `json:"overrides"`
			} `json:"resources"`
			Name struct {
				Matches string `json:"matches"`
				As      string `json:"as"`
			} `json:"name"`
			MetricsQuery string `json:"metricsQuery"`
		} `json:"externalRules"`
	}
	if err := yaml.UnmarshalStrict([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.ExternalRules) != 1 {
		t.Fatalf("%d external rules", len(cfg.ExternalRules))
	}
	rule := cfg.ExternalRules[0]
	if !strings.HasPrefix(rule.SeriesQuery, plannerMetric+"{") || rule.Name.As != plannerMetric || !strings.Contains(rule.MetricsQuery, "by (role)") {
		t.Errorf("rule %+v does not serve %s by role", rule, plannerMetric)
	}
}

func parseSeconds(t *testing.T, s string) int64 {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return int64(d.Seconds())
}
