package migrations

// ValueSetsForTest is the preflight's value sets by constraint name.
func ValueSetsForTest() map[string][]string {
	out := make(map[string][]string, len(valueSets))
	for _, v := range valueSets {
		out[v.constraint()] = v.Allowed
	}
	return out
}

// FunctionDefinitionSQLForTest is what the functions step compares: $1 is a name.
const FunctionDefinitionSQLForTest = functionDefinitionSQL

// ApplyFunctionsForTest runs the functions step alone on conn.
var ApplyFunctionsForTest = applyFunctions
