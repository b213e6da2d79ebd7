package schemas

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// nested returns d levels of arrays around null.
func nested(d int) string {
	return strings.Repeat("[", d) + "null" + strings.Repeat("]", d)
}

func mustCompile(t *testing.T, raw string) *Schema {
	t.Helper()
	s, err := Compile(json.RawMessage(raw))
	require.NoError(t, err)
	return s
}

func mustDecode(t *testing.T, raw string) any {
	t.Helper()
	v, err := Decode([]byte(raw))
	require.NoError(t, err)
	return v
}

// Two oneOf branches that both recurse make the validator's work double with each level: 18
// levels (41 bytes) took seconds unbounded. The count refuses it before validating.
func TestValidateRefusesExponentialWork(t *testing.T) {
	s := mustCompile(t, `{"$defs":{"n":{"oneOf":[{"type":"array","items":{"$ref":"#/$defs/n"}},{"type":"array","items":{"$ref":"#/$defs/n"}},{"type":"null"}]}},"$ref":"#/$defs/n"}`)

	err := s.Validate(mustDecode(t, nested(18)))
	var be *BudgetError
	require.ErrorAs(t, err, &be)
	require.False(t, be.Deep)
	require.Contains(t, err.Error(), "units of work")

	// Shallow values of the same schema still validate, and fail as the schema says.
	require.NoError(t, s.Validate(mustDecode(t, `null`)))
	err = s.Validate(mustDecode(t, nested(3)))
	require.Error(t, err, "two branches match, so oneOf fails")
	require.False(t, errors.As(err, &be), "a cheap value is validated, not refused: %v", err)
}

// Sharing without recursion multiplies too: each level of $defs is referenced twice.
func TestValidateRefusesSharedDefinitions(t *testing.T) {
	var defs []string
	for i := range 24 {
		defs = append(defs, `"d`+strconv.Itoa(i)+`":{"allOf":[{"$ref":"#/$defs/d`+strconv.Itoa(i+1)+`"},{"$ref":"#/$defs/d`+strconv.Itoa(i+1)+`"}]}`)
	}
	defs = append(defs, `"d24":{"type":"string"}`)
	s := mustCompile(t, `{"$defs":{`+strings.Join(defs, ",")+`},"$ref":"#/$defs/d0"}`)
	var be *BudgetError
	require.ErrorAs(t, s.Validate(mustDecode(t, `"x"`)), &be)
}

// Many branches each applied to every item is linear in the value but a large multiple of
// it: the budget grows with the value only so far.
func TestValidateRefusesWideFanOut(t *testing.T) {
	branches := strings.Repeat(`{"items":{"type":"integer"}},`, 999) + `{"items":{"type":"integer"}}`
	s := mustCompile(t, `{"allOf":[`+branches+`]}`)
	items := strings.Repeat("0,", 9_999) + "0"
	var be *BudgetError
	require.ErrorAs(t, s.Validate(mustDecode(t, "["+items+"]")), &be)
	require.NoError(t, s.Validate(mustDecode(t, "[0,1,2]")))
}

func TestValidateRefusesDeepValues(t *testing.T) {
	s := mustCompile(t, `{}`)
	require.NoError(t, s.Validate(mustDecode(t, nested(MaxDepth))))
	var be *BudgetError
	require.ErrorAs(t, s.Validate(mustDecode(t, nested(MaxDepth+1))), &be)
	require.True(t, be.Deep)
	require.Contains(t, be.Error(), "128 levels")
}

// Real recursive schemas stay well inside the budget: a filter language of and/or/not with
// branches that descend, and a large list of records behind a shared definition.
func TestValidateAcceptsRecursiveSchemasOfUsualShape(t *testing.T) {
	filter := mustCompile(t, `{"$defs":{"f":{"type":"object","anyOf":[
		{"properties":{"and":{"type":"array","items":{"$ref":"#/$defs/f"}}},"required":["and"]},
		{"properties":{"or":{"type":"array","items":{"$ref":"#/$defs/f"}}},"required":["or"]},
		{"properties":{"not":{"$ref":"#/$defs/f"}},"required":["not"]},
		{"properties":{"field":{"type":"string"},"eq":{}},"required":["field","eq"]}]}},"$ref":"#/$defs/f"}`)
	leaf := `{"field":"a","eq":1}`
	v := leaf
	for range 40 {
		v = `{"and":[` + v + `,{"not":` + leaf + `},{"or":[` + leaf + `,` + leaf + `]}]}`
	}
	require.NoError(t, filter.Validate(mustDecode(t, v)))

	records := mustCompile(t, `{"$defs":{"r":{"type":"object","properties":{"id":{"type":"integer"},"kind":{"oneOf":[{"const":"a"},{"const":"b"},{"const":"c"}]},"tags":{"type":"array","items":{"type":"string"}}},"required":["id"]}},
		"type":"object","properties":{"items":{"type":"array","items":{"$ref":"#/$defs/r"}}}}`)
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := range 50_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":1,"kind":"b","tags":["x","y"]}`)
	}
	b.WriteString(`]}`)
	require.NoError(t, records.Validate(mustDecode(t, b.String())))
}

// The 2020-12 way to extend a recursive schema: $dynamicRef resolves at run time, and the
// count follows every place it may land.
func TestValidateFollowsDynamicReferences(t *testing.T) {
	s := mustCompile(t, `{"$id":"urn:ringfence:tree","$dynamicAnchor":"node","type":"object",
		"properties":{"data":true,"children":{"type":"array","items":{"$dynamicRef":"#node"}}}}`)
	require.NoError(t, s.Validate(mustDecode(t, `{"data":1,"children":[{"children":[{"data":2}]}]}`)))
	require.ErrorContains(t, s.Validate(mustDecode(t, `{"children":[3]}`)), "/children/0")
}

// The usual recursive 2020-12 schema, a tree through $dynamicRef, is counted once per level,
// however deep: a reference resolves to one of its possible targets, not to all of them.
func TestValidateCountsADynamicReferenceOnce(t *testing.T) {
	s := mustCompile(t, `{"$id":"urn:ringfence:tree","$dynamicAnchor":"node","type":"object",
		"properties":{"children":{"type":"array","items":{"$dynamicRef":"#node"}}}}`)
	v := `{}`
	for range 60 { // 120 levels: an object and an array each
		v = `{"children":[` + v + `]}`
	}
	require.NoError(t, s.Validate(mustDecode(t, v)))
}

// A $dynamicRef may land on an anchor that nothing refers to statically, in another resource
// on the way there: here the outermost "node" anchor, whose two recursive oneOf branches
// double the work at each level. The count finds it, as the validator does.
func TestValidateFollowsDynamicReferencesToAnchorsNothingRefersTo(t *testing.T) {
	s := mustCompile(t, `{"$ref":"urn:r3#/$defs/entry","$defs":{
		"r3":{"$id":"urn:r3","$defs":{
			"a b/c":{"$dynamicAnchor":"node","oneOf":[{"type":"array","items":{"$dynamicRef":"#node"}},{"type":"array","items":{"$dynamicRef":"#node"}},{"type":"null"}]},
			"entry":{"$ref":"urn:r2"}}},
		"r2":{"$id":"urn:r2","$dynamicAnchor":"node","type":["array","null"],"items":{"$dynamicRef":"#node"}}}}`)
	var be *BudgetError
	require.ErrorAs(t, s.Validate(mustDecode(t, nested(16))), &be)
}

// sharedDefs builds levels of $defs, each referring to the next twice: 2^levels evaluations
// of leaf at one place, with no recursion.
func sharedDefs(levels int, leaf string) string {
	var defs []string
	for i := range levels {
		next := `{"$ref":"#/$defs/d` + strconv.Itoa(i+1) + `"}`
		defs = append(defs, `"d`+strconv.Itoa(i)+`":{"allOf":[`+next+`,`+next+`]}`)
	}
	defs = append(defs, `"d`+strconv.Itoa(levels)+`":`+leaf)
	return `{"$defs":{` + strings.Join(defs, ",") + `},"$ref":"#/$defs/d0"}`
}

// Each evaluation reads its place whole: a string's pattern and length scan it, an object's
// keys are walked. Few evaluations of a wide place pass; thousands are refused, where counting
// each as one let a 256 KiB string through 16,384 scans (51 s).
func TestValidateChargesEachEvaluationItsPlacesWidth(t *testing.T) {
	str, err := json.Marshal(strings.Repeat("a", 1<<18))
	require.NoError(t, err)
	var obj strings.Builder
	obj.WriteString(`{"k0":0`)
	for i := 1; i < 20_000; i++ {
		obj.WriteString(`,"k` + strconv.Itoa(i) + `":0`)
	}
	obj.WriteString("}")
	for _, c := range []struct{ leaf, value string }{
		{`{"type":"string","pattern":"^[a-z]*$","minLength":1}`, string(str)},
		{`{"type":"object","properties":{"x":{"type":"string"}}}`, obj.String()},
	} {
		v := mustDecode(t, c.value)
		require.NoError(t, mustCompile(t, sharedDefs(2, c.leaf)).Validate(v), "4 evaluations")
		var be *BudgetError
		require.ErrorAs(t, mustCompile(t, sharedDefs(12, c.leaf)).Validate(v), &be, "4,096 evaluations")
	}
}

// Draft 2019-09's $recursiveRef resolves to the outermost schema on the validator's path
// whose resource is anchored: with embedded resources, wherever the path entered one, here
// an inner subschema whose two recursive branches double the work each level. Such a document
// does not compile; in a document of one resource the count follows every place a
// validation starts.
func TestRecursiveReferences(t *testing.T) {
	_, err := Compile(json.RawMessage(`{"$schema":"https://json-schema.org/draft/2019-09/schema","$ref":"urn:x:b#/$defs/X",
		"$defs":{"B":{"$id":"urn:x:b","$recursiveAnchor":true,
		"$defs":{"X":{"type":"array","oneOf":[{"items":{"$recursiveRef":"#"}},{"items":{"$recursiveRef":"#"}}]}}}}}`))
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, err.Error(), "embedded resources")

	tree := mustCompile(t, `{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,
		"type":"object","propertyNames":{"maxLength":16},"properties":{"children":{"type":"array","items":{"$recursiveRef":"#"}}}}`)
	v := `{}`
	for range 60 {
		v = `{"children":[` + v + `]}`
	}
	require.NoError(t, tree.Validate(mustDecode(t, v)))
	require.ErrorContains(t, tree.Validate(mustDecode(t, `{"children":[{"children":3}]}`)), "/children/0/children")
}

// A loop that never descends into the value fails every value it reaches; it is refused
// when compiled (so the declaration screen refuses it at import), at the place it starts.
func TestCompileRefusesInPlaceLoops(t *testing.T) {
	for raw, where := range map[string]string{
		`{"$ref":"#"}`: "the root",
		`{"$defs":{"a":{"anyOf":[{"type":"string"},{"$ref":"#/$defs/b"}]},"b":{"allOf":[{"$ref":"#/$defs/a"}]}},"type":"object","properties":{"x":{"$ref":"#/$defs/a"}}}`: "/$defs/",
	} {
		_, err := Compile(json.RawMessage(raw))
		var ce *CompileError
		require.ErrorAs(t, err, &ce, raw)
		require.Contains(t, err.Error(), "without descending into the value", raw)
		require.Contains(t, err.Error(), "at "+where, raw)
	}
	// Recursion through properties or items is what schemas are for.
	mustCompile(t, `{"type":"object","properties":{"next":{"$ref":"#"}}}`)
}

// BenchmarkValidate puts the work count beside the validation it guards, for the arguments of
// a usual call and for a large structured result.
func BenchmarkValidate(b *testing.B) {
	small, err := Compile(json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"n":{"type":"integer","minimum":1}},"required":["path"]}`))
	require.NoError(b, err)
	records, err := Compile(json.RawMessage(`{"$defs":{"r":{"type":"object","properties":{"id":{"type":"integer"},"kind":{"oneOf":[{"const":"a"},{"const":"b"}]},"tags":{"type":"array","items":{"type":"string"}}}}},"type":"array","items":{"$ref":"#/$defs/r"}}`))
	require.NoError(b, err)
	many := "[" + strings.Repeat(`{"id":1,"kind":"b","tags":["x","y"]},`, 9_999) + `{"id":1}]`
	for _, c := range []struct {
		name  string
		s     *Schema
		value string
	}{{"args", small, `{"path":"/srv/a","n":2}`}, {"records-10k", records, many}} {
		v, err := Decode([]byte(c.value))
		require.NoError(b, err)
		b.Run(c.name+"/count", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.s.checkBudget(v); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/validate", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.s.s.Validate(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
