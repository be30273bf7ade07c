import { execFile } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { promisify } from 'node:util'
import t from 'tap'
import { parse } from 'yaml'
import { alertRules, dashboardQueries, RULES_FILE, recordingRules } from './rule-files.js'

/*
 * The rules file checked and unit-tested by promtool (Debian's prometheus package, 2.42), and held to what
 * docs/operations.md promises of every alert. scripts/test-prometheus.sh installs the package when missing.
 */

const run = promisify(execFile)
const UNIT_TESTS = ['test/prometheus/petstore-rules.test.yaml', 'test/prometheus/petstore-rules-daily.test.yaml']
const RUNBOOK = 'docs/operations.md'

async function promtool (args: string[]): Promise<{ code: number, output: string }> {
  try {
    const { stdout, stderr } = await run('promtool', args)
    return { code: 0, output: stdout + stderr }
  } catch (err) {
    const e = err as { code?: number, stdout?: string, stderr?: string }
    return { code: typeof e.code === 'number' ? e.code : 1, output: `${e.stdout ?? ''}${e.stderr ?? String(err)}` }
  }
}

t.test('promtool check rules: the rules file is valid', async t => {
  const { code, output } = await promtool(['check', 'rules', RULES_FILE])
  t.equal(code, 0, output)
  const rules = alertRules().length + recordingRules().length
  t.match(output, `SUCCESS: ${rules} rules found`)
})

t.test('promtool test rules: every alert fires when it should and stays silent when it should', async t => {
  const { code, output } = await promtool(['test', 'rules', ...UNIT_TESTS])
  t.equal(code, 0, output)
  t.equal(output.match(/SUCCESS/g)?.length, UNIT_TESTS.length, output)
  interface AlertTest { alertname: string, exp_alerts?: unknown[] }
  interface UnitTests { tests: Array<{ alert_rule_test?: AlertTest[] }> }
  const cases = UNIT_TESTS.flatMap(file => (parse(readFileSync(file, 'utf8')) as UnitTests).tests)
    .flatMap(test => test.alert_rule_test ?? [])
  for (const { alert } of alertRules()) {
    const mine = cases.filter(c => c.alertname === alert)
    t.ok(mine.some(c => (c.exp_alerts ?? []).length > 0), `${alert}: a case where it fires`)
    t.ok(mine.some(c => (c.exp_alerts ?? []).length === 0), `${alert}: a case where it stays silent`)
  }
  const known = new Set(alertRules().map(rule => rule.alert))
  t.same(cases.filter(c => !known.has(c.alertname)), [], 'no case for an alert that is gone')
})

t.test('every alert has a severity, a summary, a description and a runbook section of its own', async t => {
  const doc = readFileSync(RUNBOOK, 'utf8')
  const sections = [...doc.matchAll(/^### (Petstore\w+)$/gm)].map(m => m[1])
  for (const rule of alertRules()) {
    t.match(rule.labels, { severity: /^(critical|warning)$/ }, `${rule.alert}: severity`)
    t.ok((rule.annotations.summary ?? '').length > 20, `${rule.alert}: summary`)
    t.ok((rule.annotations.description ?? '').length > 40, `${rule.alert}: description`)
    t.equal(rule.annotations.runbook_url, `${RUNBOOK}#${rule.alert.toLowerCase()}`, `${rule.alert}: runbook_url`)
    t.ok(sections.includes(rule.alert), `${RUNBOOK} has a section "### ${rule.alert}"`)
    const section = doc.split(`### ${rule.alert}\n`)[1]?.split(/^#{2,3} /m)[0] ?? ''
    for (const part of ['What it means', 'What users see', 'What to do first']) {
      t.match(section, `**${part}**`, `${rule.alert}: ${part}`)
    }
  }
  const known = new Set(alertRules().map(rule => rule.alert))
  t.same(sections.filter(name => !known.has(name ?? '')), [], 'no section for an alert that is gone')
})

t.test('recording rules are named level:metric:operations and each is shared by an alert or the dashboard', async t => {
  const users = [...alertRules().map(rule => rule.expr), ...dashboardQueries().map(query => query.expr)]
  for (const { record } of recordingRules()) {
    t.match(record, /^job:petstore_[a-z0-9_]+:[a-z0-9_]+$/, record)
    t.ok(users.some(expr => expr.includes(record)), `${record} is used`)
  }
})
