/** The input builders live in fixtures/inputs.ts (shared with the demo and benchmarks). */
export * from '../../fixtures/inputs.ts'
