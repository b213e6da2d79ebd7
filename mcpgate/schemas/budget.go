package schemas

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The validator walks every branch of anyOf, oneOf and allOf, through every $ref, at every
// place of the value, and remembers nothing between walks. A schema whose branches lead back
// to the same subschema therefore costs exponentially in the depth of the value: 51 bytes of
// nested arrays against two recursive oneOf branches took 8.7 s. And each evaluation at a
// place reads it whole (an object's keys, a string's pattern and length, a const to compare),
// so many evaluations of one wide place cost its width each time. Before validating, Validate
// therefore counts, exactly and cheaply (each pair of subschema and place once), what the
// validator would do at most, in units of about a microsecond here: an evaluation of a place
// costs its width (1, plus 1 per key of an object, 1 per 8 items of an array, 1 per 64 bytes
// of a string), plus the weight (the widths summed) of a const or enum it compares against. A
// value whose count passes its budget is refused.
const (
	// minSteps is the budget of any value, however small.
	minSteps = 1 << 16
	// stepsPerUnit adds budget for each unit of the value's own weight (its widths summed),
	// so a large value against a plain schema is never refused: a plain schema evaluates each
	// place a few times.
	stepsPerUnit = 8
	// MaxDepth bounds how many levels of arrays and objects a value may nest (the value
	// itself is the first); the validator's work and every error it builds grow with depth.
	MaxDepth = 128
)

// tooDeep is the one wording of a value nested deeper than limit, for arrays and objects
// alike: the REST gateway, the result sanitizer and the declaration screen say the same.
func tooDeep(limit int) string {
	return fmt.Sprintf("nested too deeply: more than %d levels of arrays and objects", limit)
}

// BudgetError says a value would take too much work to validate against a schema.
type BudgetError struct {
	// Deep is set when the value nests more than MaxDepth levels.
	Deep bool
	// Budget is the work the value may take: minSteps plus stepsPerUnit for each unit of its
	// weight.
	Budget uint64
}

func (e *BudgetError) Error() string {
	if e.Deep {
		return tooDeep(MaxDepth)
	}
	return fmt.Sprintf("validating the value would take more than the %d units of work (about a microsecond each) a value of its size may take: the schema's anyOf, oneOf, allOf or $ref branches lead back to the same subschemas, so the work multiplies with each level of the value, or evaluate one wide place many times", e.Budget)
}

// graph is what the work count needs to know about a compiled schema beyond its fields.
type graph struct {
	dynamic map[string][]*jsonschema.Schema // by $dynamicAnchor name
	// accepts holds the JSON types each subschema goes on with past "type"; a boolean
	// schema goes on with none.
	accepts map[*jsonschema.Schema]jsonTypes
	// compares holds the weight of each subschema's const and enum values, compared with
	// the value at each of its evaluations.
	compares map[*jsonschema.Schema]uint64
	// root starts every validation, and each "propertyNames" subschema starts one of its
	// own: a $recursiveRef may resolve to any of them.
	starts []*jsonschema.Schema
}

// analyze walks every subschema reachable from root, or from anchored (the subschemas that
// declare a dynamic or recursive anchor: a reference may resolve to one that nothing refers to
// statically), and refuses a loop that never descends into the value (a $ref, allOf, anyOf,
// oneOf, not or if that leads back to itself at the same place): the validator fails every
// value that reaches one, and counting its work would be unbounded.
func analyze(root *jsonschema.Schema, anchored []*jsonschema.Schema, embedded bool) (*graph, error) {
	g := &graph{dynamic: map[string][]*jsonschema.Schema{}, accepts: map[*jsonschema.Schema]jsonTypes{},
		compares: map[*jsonschema.Schema]uint64{}, starts: []*jsonschema.Schema{root}}
	seen := map[*jsonschema.Schema]bool{}
	var all []*jsonschema.Schema
	var reach func(s *jsonschema.Schema)
	reach = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		all = append(all, s)
		g.accepts[s] = acceptedTypes(s)
		if s.Const != nil {
			g.compares[s] += weigh(*s.Const)
		}
		if s.Enum != nil {
			for _, e := range s.Enum.Values {
				g.compares[s] += weigh(e)
			}
		}
		if s.PropertyNames != nil {
			g.starts = append(g.starts, s.PropertyNames)
		}
		if s.DynamicAnchor != "" {
			g.dynamic[s.DynamicAnchor] = append(g.dynamic[s.DynamicAnchor], s)
		}
		if s.DynamicRef != nil {
			reach(s.DynamicRef.Ref)
		}
		reach(s.RecursiveRef)
		staticInPlace(s, anyKey, reach)
		for _, t := range childSchemas(s) {
			reach(t)
		}
	}
	reach(root)
	for _, s := range anchored {
		reach(s)
	}
	// A $recursiveRef whose target is anchored resolves to the outermost schema on the
	// validator's path whose resource is anchored. In a document of one resource that is
	// where a validation started; with embedded resources it is wherever the path entered
	// one, which the count cannot follow.
	for _, s := range all {
		if r := s.RecursiveRef; r != nil && r.RecursiveAnchor && embedded {
			return nil, &CompileError{Problems: []Problem{{Pointer: pointerOf(s.Location),
				Message: "a $recursiveRef in a document with embedded resources ($id) resolves to wherever validation entered an anchored one, so its work cannot be bounded; use $ref, or draft 2020-12's $dynamicRef"}}}
		}
	}

	const (
		unvisited = iota
		onPath
		done
	)
	state := map[*jsonschema.Schema]int{}
	var loop *jsonschema.Schema
	var visit func(s *jsonschema.Schema) bool
	visit = func(s *jsonschema.Schema) bool {
		switch state[s] {
		case onPath:
			loop = s
			return false
		case done:
			return true
		}
		state[s] = onPath
		ok := true
		g.inPlace(s, anyKey, func(t *jsonschema.Schema) {
			ok = ok && visit(t)
		})
		state[s] = done
		return ok
	}
	for _, s := range all {
		if !visit(s) {
			return nil, &CompileError{Problems: []Problem{{Pointer: pointerOf(loop.Location),
				Message: "refers back to itself through $ref, allOf, anyOf, oneOf, not or if without descending into the value, so every value that reaches it fails; recurse through properties or items instead"}}}
		}
	}
	return g, nil
}

// scan compiles every object of doc that declares "$dynamicAnchor" or "$recursiveAnchor" (a
// reference may resolve at run time to one that nothing refers to statically, so walking the
// compiled schema from its root would not find it) and says whether doc embeds a resource
// ("$id" below its root). An object that is not a schema (a "const" value, say) fails to
// compile or compiles to one nothing reaches; either way it changes no count.
func scan(c *jsonschema.Compiler, doc any) (anchored []*jsonschema.Schema, embedded bool) {
	var walk func(v any, ptr string)
	walk = func(v any, ptr string) {
		switch v := v.(type) {
		case map[string]any:
			_, dyn := v["$dynamicAnchor"]
			_, rec := v["$recursiveAnchor"]
			if dyn || rec {
				if s, err := c.Compile(docURL + "#" + ptr); err == nil {
					anchored = append(anchored, s)
				}
			}
			if _, id := v["$id"]; id && ptr != "" {
				embedded = true
			}
			for k, m := range v {
				walk(m, ptr+"/"+url.PathEscape(strings.NewReplacer("~", "~0", "/", "~1").Replace(k)))
			}
		case []any:
			for i, m := range v {
				walk(m, ptr+"/"+strconv.Itoa(i))
			}
		}
	}
	walk(doc, "")
	return anchored, embedded
}

// pointerOf returns the JSON Pointer tokens of a compiled subschema's location.
func pointerOf(loc string) []string {
	_, frag, _ := strings.Cut(loc, "#")
	if frag == "" {
		return nil
	}
	toks := strings.Split(strings.TrimPrefix(frag, "/"), "/")
	for i, t := range toks {
		toks[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(t)
	}
	return toks
}

// staticInPlace calls f with each subschema s applies at the same place of the value:
// $ref, not, if/then/else, allOf, anyOf, oneOf, and each dependency whose key present says
// the object has. $recursiveRef and $dynamicRef are refChoices.
func staticInPlace(s *jsonschema.Schema, present func(key string) bool, f func(*jsonschema.Schema)) {
	for _, t := range []*jsonschema.Schema{s.Ref, s.Not, s.If, s.Then, s.Else} {
		if t != nil {
			f(t)
		}
	}
	for _, group := range [][]*jsonschema.Schema{s.AllOf, s.AnyOf, s.OneOf} {
		for _, t := range group {
			f(t)
		}
	}
	for key, d := range s.Dependencies {
		if d, ok := d.(*jsonschema.Schema); ok && present(key) {
			f(d)
		}
	}
	for key, d := range s.DependentSchemas {
		if present(key) {
			f(d)
		}
	}
}

// anyKey is present for analyze, which must follow every dependency.
func anyKey(string) bool { return true }

// keyOf is present for a value that is obj (nil unless an object).
func keyOf(obj map[string]any) func(string) bool {
	return func(key string) bool {
		_, ok := obj[key]
		return ok
	}
}

// childSchemas lists the subschemas s applies to the value's members.
func childSchemas(s *jsonschema.Schema) []*jsonschema.Schema {
	out := []*jsonschema.Schema{s.PropertyNames, s.Contains, s.Items2020, s.UnevaluatedProperties, s.UnevaluatedItems}
	for _, p := range s.Properties {
		out = append(out, p)
	}
	for _, p := range s.PatternProperties {
		out = append(out, p)
	}
	out = append(out, s.PrefixItems...)
	for _, x := range []any{s.AdditionalProperties, s.AdditionalItems, s.Items} {
		switch x := x.(type) {
		case *jsonschema.Schema:
			out = append(out, x)
		case []*jsonschema.Schema:
			out = append(out, x...)
		}
	}
	return out
}

// inPlace calls f with every subschema s may apply at the same place (present as for
// staticInPlace), including every subschema a dynamic or recursive reference may resolve to.
func (g *graph) inPlace(s *jsonschema.Schema, present func(string) bool, f func(*jsonschema.Schema)) {
	staticInPlace(s, present, f)
	for _, choice := range g.refChoices(s) {
		for _, t := range choice {
			f(t)
		}
	}
}

// refChoices lists, for each of s's $recursiveRef and $dynamicRef, the subschemas it may
// resolve to at run time (which one depends on the path the validator took there): it
// evaluates exactly one of each list.
func (g *graph) refChoices(s *jsonschema.Schema) [][]*jsonschema.Schema {
	var out [][]*jsonschema.Schema
	if r := s.RecursiveRef; r != nil {
		choice := []*jsonschema.Schema{r}
		if r.RecursiveAnchor {
			choice = appendNew(choice, g.starts)
		}
		out = append(out, choice)
	}
	if d := s.DynamicRef; d != nil {
		choice := []*jsonschema.Schema{d.Ref}
		if d.Anchor != "" && d.Ref.DynamicAnchor == d.Anchor {
			choice = appendNew(choice, g.dynamic[d.Anchor])
		}
		out = append(out, choice)
	}
	return out
}

func appendNew(list, more []*jsonschema.Schema) []*jsonschema.Schema {
	for _, s := range more {
		if !slices.Contains(list, s) {
			list = append(list, s)
		}
	}
	return list
}

// counter counts, for one value, the most subschema evaluations validating it may take. The
// count is an upper bound: every branch is counted as evaluated, whatever the validator may
// skip once it knows the answer. The counting itself is bounded by the same budget.
type counter struct {
	g      *graph
	budget uint64
	steps  uint64
	over   bool
	// scalars memoizes the count of a subschema at a scalar, which depends on its type only.
	scalars map[scalarKey]uint64
	buf     []*jsonschema.Schema // reused by members
}

type scalarKey struct {
	s   *jsonschema.Schema
	typ jsonTypes
}

// checkBudget returns a *BudgetError when validating v against s may take more than its budget.
func (sch *Schema) checkBudget(v any) error {
	weight, deep := measure(v, 0)
	if deep {
		return &BudgetError{Deep: true}
	}
	budget := uint64(minSteps) + stepsPerUnit*weight
	c := &counter{g: sch.g, budget: budget, scalars: map[scalarKey]uint64{}}
	costs := c.at(v, []*jsonschema.Schema{sch.s})
	if c.over || costs[sch.s] > budget {
		return &BudgetError{Budget: budget}
	}
	return nil
}

// width is what one evaluation of v reads of it besides its members: an object's keys, an
// array's items (a few at a time), a string's bytes (for a pattern, a length, a format).
func width(v any) uint64 {
	switch v := v.(type) {
	case map[string]any:
		return 1 + uint64(len(v))
	case []any:
		return 1 + uint64(len(v))/8
	case string:
		return 1 + uint64(len(v))/64
	}
	return 1
}

// measure sums the widths of v and everything in it, stopping once it nests more than
// MaxDepth levels of arrays and objects; depth is the levels around v.
func measure(v any, depth int) (weight uint64, deep bool) {
	weight = width(v)
	switch v := v.(type) {
	case map[string]any:
		if depth >= MaxDepth {
			return 0, true
		}
		for k, m := range v {
			n, d := measure(m, depth+1)
			if d {
				return 0, true
			}
			weight += n + width(k)
		}
	case []any:
		if depth >= MaxDepth {
			return 0, true
		}
		for _, m := range v {
			n, d := measure(m, depth+1)
			if d {
				return 0, true
			}
			weight += n
		}
	}
	return weight, false
}

// weigh is measure for a schema's own const and enum values, however deep.
func weigh(v any) uint64 {
	w, _ := measure(v, math.MinInt)
	return w
}

// mul multiplies without overflowing.
func (c *counter) mul(a, b uint64) uint64 {
	if a != 0 && b > math.MaxUint64/a {
		return math.MaxUint64
	}
	return a * b
}

// add adds without overflowing; anything past the budget is simply "too much".
func (c *counter) add(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// step accounts for the counting's own work and says whether to go on.
func (c *counter) step() bool {
	c.steps++
	if c.steps > c.budget {
		c.over = true
	}
	return !c.over
}

// jsonTypes is a set of JSON types, one bit each.
type jsonTypes uint8

const (
	typeNull jsonTypes = 1 << iota
	typeBoolean
	typeNumber
	typeString
	typeArray
	typeObject
	anyType = typeNull | typeBoolean | typeNumber | typeString | typeArray | typeObject
)

// typeOf is the JSON type of a decoded value.
func typeOf(v any) jsonTypes {
	switch v.(type) {
	case nil:
		return typeNull
	case bool:
		return typeBoolean
	case string:
		return typeString
	case map[string]any:
		return typeObject
	case []any:
		return typeArray
	}
	return typeNumber
}

// acceptedTypes is the set of types s goes on with past its "type"; a mismatch ends its
// evaluation at once. "integer" is taken to admit every number, which only over-counts.
func acceptedTypes(s *jsonschema.Schema) jsonTypes {
	if s.Bool != nil {
		return 0
	}
	if s.Types == nil || s.Types.IsEmpty() {
		return anyType
	}
	var set jsonTypes
	for _, t := range s.Types.ToStrings() {
		set |= map[string]jsonTypes{"null": typeNull, "boolean": typeBoolean, "number": typeNumber,
			"integer": typeNumber, "string": typeString, "array": typeArray, "object": typeObject}[t]
	}
	return set
}

// applies says whether s goes on past its "type" for a value of type typ.
func (c *counter) applies(s *jsonschema.Schema, typ jsonTypes) bool {
	return c.g.accepts[s]&typ != 0
}

// scalar counts the evaluations of s at a scalar of type typ, each with what it compares
// against; members multiplies by the scalar's width.
func (c *counter) scalar(s *jsonschema.Schema, typ jsonTypes) uint64 {
	k := scalarKey{s, typ}
	if n, ok := c.scalars[k]; ok {
		return n
	}
	if !c.step() {
		return math.MaxUint64
	}
	n := c.add(1, c.g.compares[s])
	if c.applies(s, typ) {
		n = c.inPlaceCount(s, nil, n, func(t *jsonschema.Schema) uint64 { return c.scalar(t, typ) })
	}
	c.scalars[k] = n
	return n
}

// at counts the evaluations of each schema in need at the value v. The subschemas that apply
// in place form a DAG (analyze refused loops), so each is counted once per place; members
// are counted once for all the subschemas that apply to them.
func (c *counter) at(v any, need []*jsonschema.Schema) map[*jsonschema.Schema]uint64 {
	typ := typeOf(v)
	out := make(map[*jsonschema.Schema]uint64, len(need))
	obj, _ := v.(map[string]any)

	// The subschemas evaluated here, in place.
	var here []*jsonschema.Schema
	seen := map[*jsonschema.Schema]bool{}
	var collect func(s *jsonschema.Schema)
	collect = func(s *jsonschema.Schema) {
		if seen[s] || !c.step() {
			return
		}
		seen[s] = true
		here = append(here, s)
		if c.applies(s, typ) {
			c.g.inPlace(s, keyOf(obj), collect)
		}
	}
	for _, s := range need {
		collect(s)
	}
	if c.over {
		return out
	}

	// What each of them spends on the members.
	own := make(map[*jsonschema.Schema]uint64, len(here))
	switch v := v.(type) {
	case map[string]any:
		for key, member := range v {
			c.members(here, typ, member, func(out []*jsonschema.Schema, s *jsonschema.Schema) []*jsonschema.Schema {
				return propertySchemas(out, s, key)
			}, own)
			for _, s := range here {
				if c.applies(s, typ) && s.PropertyNames != nil {
					own[s] = c.add(own[s], c.mul(c.scalar(s.PropertyNames, typeString), width(key)))
				}
			}
			if c.over {
				return out
			}
		}
	case []any:
		for i, member := range v {
			c.members(here, typ, member, func(out []*jsonschema.Schema, s *jsonschema.Schema) []*jsonschema.Schema {
				return itemSchemas(out, s, i)
			}, own)
			if c.over {
				return out
			}
		}
		unique := uint64(0) // what uniqueItems reads: up to 20 items compared pairwise, more hashed
		for _, s := range here {
			if c.applies(s, typ) && s.UniqueItems {
				if unique == 0 {
					w, _ := measure(v, 0)
					unique = c.add(w, uint64(len(v)))
					if len(v) <= 20 {
						unique = c.mul(w, uint64(len(v)))
					}
				}
				own[s] = c.add(own[s], unique)
			}
		}
	}

	// Totals, each subschema once.
	total := make(map[*jsonschema.Schema]uint64, len(here))
	var count func(s *jsonschema.Schema) uint64
	count = func(s *jsonschema.Schema) uint64 {
		if n, ok := total[s]; ok {
			return n
		}
		n := c.add(c.add(width(v), c.g.compares[s]), own[s])
		if c.applies(s, typ) {
			n = c.inPlaceCount(s, obj, n, count)
		}
		total[s] = n
		return n
	}
	for _, s := range need {
		out[s] = count(s)
	}
	return out
}

// inPlaceCount adds to n what the subschemas s applies in place count (count gives each):
// each static one, and for each reference the most any of its choices counts.
func (c *counter) inPlaceCount(s *jsonschema.Schema, obj map[string]any, n uint64, count func(*jsonschema.Schema) uint64) uint64 {
	staticInPlace(s, keyOf(obj), func(t *jsonschema.Schema) { n = c.add(n, count(t)) })
	for _, choice := range c.g.refChoices(s) {
		var most uint64
		for _, t := range choice {
			most = max(most, count(t))
		}
		n = c.add(n, most)
	}
	return n
}

// members counts one member against what each subschema here applies to it (pick appends
// those to its buffer), adding each subschema's share to own.
func (c *counter) members(here []*jsonschema.Schema, typ jsonTypes, member any, pick func([]*jsonschema.Schema, *jsonschema.Schema) []*jsonschema.Schema, own map[*jsonschema.Schema]uint64) {
	mtyp := typeOf(member)
	if mtyp != typeObject && mtyp != typeArray {
		// A scalar's count depends on its type only, so nothing needs collecting.
		for _, s := range here {
			if !c.applies(s, typ) || !c.step() {
				continue
			}
			c.buf = pick(c.buf[:0], s)
			for _, t := range c.buf {
				own[s] = c.add(own[s], c.mul(c.scalar(t, mtyp), width(member)))
			}
		}
		return
	}
	var need []*jsonschema.Schema
	per := make(map[*jsonschema.Schema][]*jsonschema.Schema, len(here))
	for _, s := range here {
		if !c.applies(s, typ) || !c.step() {
			continue
		}
		if ts := pick(nil, s); len(ts) > 0 {
			per[s] = ts
			need = append(need, ts...)
		}
	}
	if len(need) == 0 || c.over {
		return
	}
	costs := c.at(member, need)
	for s, ts := range per {
		for _, t := range ts {
			own[s] = c.add(own[s], costs[t])
		}
	}
}

// propertySchemas lists what s applies to the member named key.
func propertySchemas(out []*jsonschema.Schema, s *jsonschema.Schema, key string) []*jsonschema.Schema {
	n := len(out)
	if p, ok := s.Properties[key]; ok {
		out = append(out, p)
	}
	for re, p := range s.PatternProperties {
		if re.MatchString(key) {
			out = append(out, p)
		}
	}
	if a, ok := s.AdditionalProperties.(*jsonschema.Schema); ok && len(out) == n {
		out = append(out, a)
	}
	if s.UnevaluatedProperties != nil {
		out = append(out, s.UnevaluatedProperties)
	}
	return out
}

// itemSchemas lists what s applies to item i of an array.
func itemSchemas(out []*jsonschema.Schema, s *jsonschema.Schema, i int) []*jsonschema.Schema {
	if s.DraftVersion < 2020 {
		switch items := s.Items.(type) {
		case *jsonschema.Schema:
			out = append(out, items)
		case []*jsonschema.Schema:
			if i < len(items) {
				out = append(out, items[i])
			} else if a, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
				out = append(out, a)
			}
		default:
			if a, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
				out = append(out, a)
			}
		}
	} else if i < len(s.PrefixItems) {
		out = append(out, s.PrefixItems[i])
	} else if s.Items2020 != nil {
		out = append(out, s.Items2020)
	}
	if s.Contains != nil {
		out = append(out, s.Contains)
	}
	if s.UnevaluatedItems != nil {
		out = append(out, s.UnevaluatedItems)
	}
	return out
}
