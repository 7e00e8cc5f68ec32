//! Features as CSV with a WKT geometry column, as GDAL's CSV driver writes and reads it:
//! `WKT` first, then the layer's columns in its order. For `geoshard export` and the OGC API
//! items' `f=csv`.

use std::io::Write;

use serde_json::Value;

/// A CSV being written a GeoJSON feature at a time.
pub struct CsvWkt<W: Write> {
    out: csv::Writer<W>,
    columns: Vec<String>,
}

impl<W: Write> CsvWkt<W> {
    /// Start with the header: `WKT`, then `columns`.
    pub fn new(out: W, columns: Vec<String>) -> Result<CsvWkt<W>, String> {
        let mut out = csv::Writer::from_writer(out);
        out.write_record(std::iter::once("WKT").chain(columns.iter().map(String::as_str)))
            .map_err(|e| e.to_string())?;
        Ok(CsvWkt { out, columns })
    }

    /// A row of a GeoJSON feature: its geometry as WKT, then its properties by column.
    pub fn feature(&mut self, f: &Value) -> Result<(), String> {
        let wkt = wkt_of(&f["geometry"])?;
        let props = f["properties"].as_object();
        let row = std::iter::once(wkt).chain(
            self.columns
                .iter()
                .map(|c| cell(props.and_then(|p| p.get(c)))),
        );
        self.out.write_record(row).map_err(|e| e.to_string())
    }

    /// Flush, and give the writer back.
    pub fn finish(self) -> Result<W, String> {
        self.out.into_inner().map_err(|e| e.to_string())
    }
}

/// A GeoJSON geometry as WKT; empty for none.
pub fn wkt_of(geometry: &Value) -> Result<String, String> {
    use wkt::ToWkt;
    if geometry.is_null() {
        return Ok(String::new());
    }
    let g = crate::spatial::parse_geojson(geometry).map_err(|e| e.to_string())?;
    Ok(g.wkt_string())
}

/// A property as a CSV cell: text as it is, anything else as its JSON, null as empty.
pub fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_feature_is_a_row_of_wkt_then_its_columns() {
        let mut w = CsvWkt::new(
            Vec::new(),
            vec!["OBJECTID".into(), "name".into(), "pop".into()],
        )
        .unwrap();
        w.feature(&json!({"type": "Feature", "properties": {"OBJECTID": 3, "name": "a, \"b\"", "pop": null},
            "geometry": {"type": "Polygon", "coordinates": [[[0.5, 0], [1, 0], [1, 1.25], [0.5, 0]]]}}))
            .unwrap();
        w.feature(
            &json!({"type": "Feature", "properties": {"OBJECTID": 4, "name": "c", "pop": 2.5},
            "geometry": null}),
        )
        .unwrap();
        let text = String::from_utf8(w.finish().unwrap()).unwrap();
        assert_eq!(
            text,
            "WKT,OBJECTID,name,pop\n\"POLYGON((0.5 0,1 0,1 1.25,0.5 0))\",3,\"a, \"\"b\"\"\",\n,4,c,2.5\n"
        );
    }
}
