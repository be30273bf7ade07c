import { Type, type Static } from '@sinclair/typebox'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type pg from 'pg'
import { withDatabase } from '../../src/db/errors.js'
import { errorResponses } from '../../src/http/errors.js'
import { createHandler, listHandler } from '../../src/http/replies.js'
import { ref } from '../../src/http/shared-schemas.js'
import { Collection } from '../../src/machinery/collection.js'
import { digestOf } from '../../src/machinery/idempotency.js'
import { NAME_PATTERN } from '../../src/shared/text-rules.js'

/*
 * A second resource that exists only in the tests: widgets, made the way
 * docs/architecture.md says to add a resource (a table whose trigger notifies its
 * channel, a repository, one Collection, a plugin with its routes). It proves
 * that the machinery serves more than categories.
 */

export const WIDGETS_CHANNEL = 'widgets_changed'

/** What a migration would create for a real resource; the test runs it on its own database. */
export const WIDGETS_TABLE = `
CREATE TABLE widgets (id bigserial PRIMARY KEY, name text NOT NULL);
CREATE FUNCTION widgets_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('${WIDGETS_CHANNEL}', current_setting('application_name'));
  RETURN NULL;
END
$$;
CREATE TRIGGER widgets_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON widgets
  FOR EACH STATEMENT EXECUTE FUNCTION widgets_notify_change();`

const NewWidgetSchema = Type.Object({ name: Type.String({ minLength: 1, maxLength: 100, pattern: NAME_PATTERN }) }, { $id: 'NewWidget', additionalProperties: false })
const WidgetSchema = Type.Object({ id: Type.Unsafe<bigint>({ type: 'integer', format: 'int64' }), name: Type.String() }, { $id: 'Widget', additionalProperties: false })
type NewWidget = Static<typeof NewWidgetSchema>
type Widget = Static<typeof WidgetSchema>

class WidgetRepository {
  constructor (private readonly pool: pg.Pool) {}

  async insertBatch (inputs: NewWidget[]): Promise<Widget[]> {
    const { rows } = await withDatabase(async () => await this.pool.query<Widget>({
      text: 'INSERT INTO widgets (name) SELECT name FROM unnest($1::text[]) WITH ORDINALITY AS t(name, ord) ORDER BY ord RETURNING id, name',
      values: [inputs.map(w => w.name)]
    }))
    // Ids are drawn in the SELECT's order: sorted by id, row i is input i.
    return rows.sort((a, b) => a.id < b.id ? -1 : 1)
  }

  async insertWith (client: pg.ClientBase, input: NewWidget): Promise<Widget> {
    const { rows } = await withDatabase(async () => await client.query<Widget>({ text: 'INSERT INTO widgets (name) VALUES ($1) RETURNING id, name', values: [input.name] }))
    return rows[0] as Widget
  }

  async listInChunks (onChunk: (rows: Widget[]) => void): Promise<void> {
    const { rows } = await withDatabase(async () => await this.pool.query<Widget>('SELECT id, name FROM widgets ORDER BY id'))
    if (rows.length > 0) onChunk(rows)
  }
}

async function widgets (app: FastifyInstance): Promise<void> {
  for (const schema of [NewWidgetSchema, WidgetSchema]) app.addSchema(schema)
  const collection = new Collection<NewWidget, Widget>({
    repository: new WidgetRepository(app.pool),
    feed: app.changeFeed,
    channel: WIDGETS_CHANNEL,
    idempotency: app.idempotency,
    createOperation: 'createWidget',
    requestHash: widget => digestOf([widget.name]),
    metricPrefix: 'widgets',
    rowName: 'Widget',
    registry: app.metrics
  })
  const api = app.withTypeProvider<TypeBoxTypeProvider>()

  api.get('/v1/widgets', { schema: { hide: true, response: { 200: Type.Array(ref(WidgetSchema)), ...errorResponses(401, 503) } } }, listHandler(collection))
  api.post('/v1/widgets', {
    schema: { hide: true, headers: Type.Object({ 'idempotency-key': Type.Optional(Type.String({ minLength: 1 })) }), body: ref(NewWidgetSchema), response: { 201: ref(WidgetSchema), ...errorResponses(400, 401, 409, 422, 503) } }
  }, createHandler(collection, widget => `/v1/widgets/${widget.id}`))
}

export default fp(widgets, { name: 'widgets', dependencies: ['data'] })
