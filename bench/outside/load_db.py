import io
import os
import sys
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CONN, load

xtr, ytr, xte, yte = load()
c = psycopg2.connect(**CONN); c.autocommit = True
cur = c.cursor()
for t, x, y in (('fm_train', xtr, ytr), ('fm_test', xte, yte)):
    cur.execute(f'DROP TABLE IF EXISTS {t}')
    cur.execute(f'CREATE TABLE {t} (id int PRIMARY KEY, y int NOT NULL, x real[] NOT NULL)')
    t0 = time.time()
    buf = io.StringIO()
    for i in range(len(y)):
        buf.write(f"{i}\t{int(y[i])}\t{{{','.join(f'{v:.6g}' for v in x[i])}}}\n")
    buf.seek(0)
    cur.copy_expert(f'COPY {t} (id, y, x) FROM STDIN', buf)
    print(t, len(y), 'rows', round(time.time()-t0, 1), 's')
cur.execute('DROP TABLE IF EXISTS fm_train20k')
cur.execute('CREATE TABLE fm_train20k AS SELECT * FROM fm_train WHERE id < 20000')
