import { readFile } from 'node:fs/promises'
import type { FastifyInstance } from 'fastify'
import widgets from './routes.js'

/** The widgets migration's Up part, as the runner would apply it. */
export const widgetsMigration = (await readFile(new URL('migration.sql', import.meta.url), 'utf8')).split(
  '-- Down Migration'
)[0] as string

/** testApp's `register` for an app that serves widgets beside categories. */
export async function registerWidgets (app: FastifyInstance): Promise<void> {
  await app.register(widgets)
}
