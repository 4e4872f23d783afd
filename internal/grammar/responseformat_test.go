package grammar

import "testing"

func TestParseResponseFormat(t *testing.T) {
	c, ok, err := ParseResponseFormat([]byte(`{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}}}`))
	if err != nil || !ok || c.Kind != KindJSONSchema || c.Spec != `{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}` {
		t.Fatalf("json_schema: %+v %v %v", c, ok, err)
	}
	if _, err := ForRequest(c.Kind, c.Spec, loadTok(t, "stories260K")); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := ParseResponseFormat([]byte(`{"type":"json_object"}`)); err != nil || !ok || c.Kind != KindJSONObject {
		t.Fatalf("json_object: %+v %v %v", c, ok, err)
	}
	if _, ok, err := ParseResponseFormat([]byte(`{"type":"text"}`)); err != nil || ok {
		t.Fatalf("text: %v %v", ok, err)
	}
	for _, bad := range []string{`{"type":"json_schema"}`, `{"type":"json_schema","json_schema":{"name":"x","schema":null}}`, `{"type":"xml"}`, `[]`, `"json"`} {
		if _, _, err := ParseResponseFormat([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
