// Express 5 with node-postgres, as their documentation writes it: one pool query per request, no cache.
import express from 'express'
import pg from 'pg'
import {
  INSERT, env, expectedAuthorization, host, invalid, isNewCategory, port, toCategory, unauthorized
} from './common.js'

const pool = new pg.Pool({ connectionString: env.DATABASE_URL })

const app = express()
app.use(express.json())
app.use('/v1', (req, res, next) => {
  if (!expectedAuthorization.has(req.get('authorization') ?? '')) {
    res.set('www-authenticate', 'Bearer realm="petstore"').status(401).json(unauthorized)
    return
  }
  next()
})

app.get('/v1/categories', async (req, res) => {
  const { rows } = await pool.query('SELECT id, name, description FROM categories ORDER BY id')
  res.set('cache-control', 'no-cache').json(rows.map(toCategory))
})

app.post('/v1/categories', async (req, res) => {
  if (!isNewCategory(req.body)) {
    res.status(400).json(invalid)
    return
  }
  const { rows } = await pool.query(INSERT, [req.body.name, req.body.description ?? null])
  const category = toCategory(rows[0])
  res.status(201).location(`/v1/categories/${category.id}`).json(category)
})

app.listen(port, host)
