//! Esri's protobuf feature format (`f=pbf`), which the ArcGIS JS API and ArcGIS Online ask
//! for: the messages of the ArcGIS REST API's `FeatureCollection.proto` (package
//! `esriPBuffer`) that a query's answer uses, encoded with prost. Coordinates are quantized
//! to integers by a transform (a scale and the origin's translation, from the upper left) and
//! each part's positions after its first are deltas from the one before.

use prost::Message;

use super::esri_out::{EsriShape, Quantization};
use super::*;

#[derive(Clone, PartialEq, prost::Message)]
pub struct FeatureCollectionPBuffer {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, optional, tag = "2")]
    pub query_result: Option<QueryResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryResult {
    #[prost(oneof = "Results", tags = "1, 2, 3")]
    pub results: Option<Results>,
}

/// Named as in Esri's proto.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Results {
    #[prost(message, tag = "1")]
    FeatureResult(FeatureResult),
    #[prost(message, tag = "2")]
    CountResult(CountResult),
    #[prost(message, tag = "3")]
    IdsResult(ObjectIdsResult),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CountResult {
    #[prost(uint64, tag = "1")]
    pub count: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectIdsResult {
    #[prost(string, tag = "1")]
    pub object_id_field_name: String,
    #[prost(uint64, repeated, tag = "3")]
    pub object_ids: Vec<u64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FeatureResult {
    #[prost(string, tag = "1")]
    pub object_id_field_name: String,
    #[prost(message, optional, tag = "2")]
    pub unique_id_field: Option<UniqueIdField>,
    #[prost(string, tag = "3")]
    pub global_id_field_name: String,
    /// Point 0, Multipoint 1, Polyline 2, Polygon 3, None 127.
    #[prost(int32, tag = "7")]
    pub geometry_type: i32,
    #[prost(message, optional, tag = "8")]
    pub spatial_reference: Option<SpatialReference>,
    #[prost(bool, tag = "9")]
    pub exceeded_transfer_limit: bool,
    #[prost(bool, tag = "10")]
    pub has_z: bool,
    #[prost(bool, tag = "11")]
    pub has_m: bool,
    #[prost(message, optional, tag = "12")]
    pub transform: Option<Transform>,
    #[prost(message, repeated, tag = "13")]
    pub fields: Vec<Field>,
    #[prost(message, repeated, tag = "15")]
    pub features: Vec<Feature>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UniqueIdField {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(bool, tag = "2")]
    pub is_system_maintained: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SpatialReference {
    #[prost(uint32, tag = "1")]
    pub wkid: u32,
    /// So spelled in Esri's proto.
    #[prost(uint32, tag = "2")]
    pub lastest_wkid: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Transform {
    /// Upper left 0, lower left 1.
    #[prost(int32, tag = "1")]
    pub quantize_origin_postion: i32,
    #[prost(message, optional, tag = "2")]
    pub scale: Option<Scale>,
    #[prost(message, optional, tag = "3")]
    pub translate: Option<Translate>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Scale {
    #[prost(double, tag = "1")]
    pub x_scale: f64,
    #[prost(double, tag = "2")]
    pub y_scale: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Translate {
    #[prost(double, tag = "1")]
    pub x_translate: f64,
    #[prost(double, tag = "2")]
    pub y_translate: f64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Field {
    #[prost(string, tag = "1")]
    pub name: String,
    /// SmallInteger 0, Integer 1, Single 2, Double 3, String 4, Date 5, OID 6.
    #[prost(int32, tag = "2")]
    pub field_type: i32,
    #[prost(string, tag = "3")]
    pub alias: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Feature {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<PbfValue>,
    #[prost(message, optional, tag = "2")]
    pub geometry: Option<PbfGeometry>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PbfGeometry {
    #[prost(uint32, repeated, tag = "2")]
    pub lengths: Vec<u32>,
    #[prost(sint64, repeated, tag = "3")]
    pub coords: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PbfValue {
    #[prost(oneof = "ValueType", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9")]
    pub value_type: Option<ValueType>,
}

/// Named as in Esri's proto.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ValueType {
    #[prost(string, tag = "1")]
    StringValue(String),
    #[prost(float, tag = "2")]
    FloatValue(f32),
    #[prost(double, tag = "3")]
    DoubleValue(f64),
    #[prost(sint32, tag = "4")]
    SintValue(i32),
    #[prost(uint32, tag = "5")]
    UintValue(u32),
    #[prost(int64, tag = "6")]
    Int64Value(i64),
    #[prost(uint64, tag = "7")]
    Uint64Value(u64),
    #[prost(sint64, tag = "8")]
    Sint64Value(i64),
    #[prost(bool, tag = "9")]
    BoolValue(bool),
}

impl Quantization {
    fn transform(&self) -> Transform {
        Transform {
            quantize_origin_postion: i32::from(self.lower_left),
            scale: Some(Scale {
                x_scale: self.scale,
                y_scale: self.scale,
            }),
            translate: Some(Translate {
                x_translate: self.origin[0],
                y_translate: self.origin[1],
            }),
        }
    }

    /// Parts (rings, paths, or one part of points) as lengths and delta-encoded coordinates.
    /// In view mode a repeated position is left out, and a part left too short with it.
    fn parts(&self, parts: &[Vec<[f64; 2]>], least: usize) -> PbfGeometry {
        let mut g = PbfGeometry::default();
        for part in parts {
            let mut q: Vec<[i64; 2]> = Vec::with_capacity(part.len());
            for &p in part {
                let at = self.quantize(p);
                if !(self.view && q.last() == Some(&at)) {
                    q.push(at);
                }
            }
            if q.len() < least {
                continue;
            }
            g.lengths.push(q.len() as u32);
            let mut last = [0i64; 2];
            for (i, at) in q.iter().enumerate() {
                if i == 0 {
                    g.coords.extend_from_slice(at);
                } else {
                    // Saturating: a client's tiny tolerance can put positions at the ends of
                    // i64, whose difference would overflow.
                    g.coords.push(at[0].saturating_sub(last[0]));
                    g.coords.push(at[1].saturating_sub(last[1]));
                }
                last = *at;
            }
        }
        g
    }
}

/// Esri's geometry type number for a layer's geometry type.
fn geometry_type_number(t: &str) -> i32 {
    match esri_out::esri_geometry_type(t) {
        "esriGeometryPoint" => 0,
        "esriGeometryMultipoint" => 1,
        "esriGeometryPolyline" => 2,
        _ => 3,
    }
}

/// Esri's field type number for a column.
fn field_type_number(kind: &str, is_id: bool) -> i32 {
    match esri_out::esri_field_type(kind, is_id) {
        "esriFieldTypeOID" => 6,
        "esriFieldTypeInteger" => 1,
        "esriFieldTypeDouble" => 3,
        "esriFieldTypeDate" => 5,
        _ => 4,
    }
}

fn value(v: &Datum<'_>) -> PbfValue {
    let value_type = match v {
        Datum::Null => None,
        Datum::Int(i) => Some(match i32::try_from(*i) {
            Ok(small) => ValueType::SintValue(small),
            Err(_) => ValueType::Sint64Value(*i),
        }),
        Datum::Float(f) => Some(ValueType::DoubleValue(*f)),
        Datum::Str(s) => Some(ValueType::StringValue(s.to_string())),
        Datum::Bool(b) => Some(ValueType::SintValue(i32::from(*b))),
        Datum::Date(ms) => Some(ValueType::Sint64Value(*ms)),
    };
    PbfValue { value_type }
}

/// An Esri geometry (as [`EsriShape::geometry`] makes it) quantized.
fn geometry(esri: &Value, q: &Quantization) -> Option<PbfGeometry> {
    use serde::Deserialize;
    let parts = |v: &Value| Vec::<Vec<[f64; 2]>>::deserialize(v).ok();
    if let (Some(x), Some(y)) = (esri["x"].as_f64(), esri["y"].as_f64()) {
        let at = q.quantize([x, y]);
        return Some(PbfGeometry {
            lengths: Vec::new(),
            coords: at.to_vec(),
        });
    }
    if let Some(points) = esri.get("points") {
        let points = Vec::<[f64; 2]>::deserialize(points).ok()?;
        return Some(q.parts(&[points], 1));
    }
    if let Some(paths) = esri.get("paths") {
        return Some(q.parts(&parts(paths)?, 2));
    }
    if let Some(rings) = esri.get("rings") {
        return Some(q.parts(&parts(rings)?, 4));
    }
    None
}

/// A query result, encoded.
fn wrap(results: Results) -> Vec<u8> {
    Message::encode_to_vec(&FeatureCollectionPBuffer {
        version: String::new(),
        query_result: Some(QueryResult {
            results: Some(results),
        }),
    })
}

impl Queries<'_> {
    pub(super) fn write_pbf_count(&self, count: usize) -> Vec<u8> {
        wrap(Results::CountResult(CountResult {
            count: count as u64,
        }))
    }

    pub(super) fn write_pbf_ids(&self, id_name: &str, rows: &[(i64, u32)]) -> Vec<u8> {
        wrap(Results::IdsResult(ObjectIdsResult {
            object_id_field_name: id_name.to_string(),
            object_ids: rows.iter().map(|(id, _)| *id as u64).collect(),
        }))
    }

    /// A page of features as Esri's protobuf feature result.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_pbf_features(
        &self,
        resolved: &Resolved<'_>,
        data: Option<&ViewData>,
        def: Option<&ViewDef>,
        page: &[u32],
        out_cols: &[usize],
        exceeded: bool,
        q: &QuerySpec,
        shape: &EsriShape,
        quantization: &Quantization,
    ) -> Vec<u8> {
        let id_name = def.map_or(resolved.layer.id_field.as_str(), |d| {
            d.columns[d.id_column].name.as_str()
        });
        let web = shape.web_mercator;
        let mut result = FeatureResult {
            object_id_field_name: id_name.to_string(),
            unique_id_field: Some(UniqueIdField {
                name: id_name.to_string(),
                is_system_maintained: true,
            }),
            geometry_type: if q.return_geometry {
                geometry_type_number(&resolved.layer.geometry_type)
            } else {
                127
            },
            spatial_reference: Some(SpatialReference {
                wkid: if web { 102100 } else { 4326 },
                lastest_wkid: if web { 3857 } else { 4326 },
            }),
            exceeded_transfer_limit: exceeded,
            transform: Some(quantization.transform()),
            ..FeatureResult::default()
        };
        if let Some(def) = def {
            result.fields = out_cols
                .iter()
                .map(|&c| {
                    let col = &def.columns[c];
                    Field {
                        name: col.name.clone(),
                        field_type: field_type_number(col.scalar.field_type(), c == def.id_column),
                        alias: col.name.clone(),
                    }
                })
                .collect();
        }
        if let Some(data) = data {
            let geometries = q
                .return_geometry
                .then(|| data.geometry_column(resolved.layer.geometry_path.text()));
            result.features = page
                .iter()
                .map(|&slot| Feature {
                    attributes: out_cols
                        .iter()
                        .map(|&c| value(&data.columns[c].get(slot as usize)))
                        .collect(),
                    geometry: geometries.and_then(|g| g.get(slot)).and_then(|g| {
                        let v = match g {
                            GeometryRef::Point(x, y) => {
                                json!({"type": "Point", "coordinates": [x, y]})
                            }
                            GeometryRef::Json(bytes) => serde_json::from_slice(bytes).ok()?,
                        };
                        geometry(&shape.geometry(&v), quantization)
                    }),
                })
                .collect();
        }
        wrap(Results::FeatureResult(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_quantized_and_delta_encoded_from_the_upper_left() {
        let q = Quantization {
            scale: 0.5,
            origin: [10.0, 20.0],
            lower_left: false,
            view: true,
        };
        assert_eq!(q.quantize([11.0, 19.0]), [2, 2]);
        let ring = vec![
            [10.0, 20.0],
            [12.0, 20.0],
            [12.1, 20.0],
            [12.0, 18.0],
            [10.0, 20.0],
        ];
        let g = q.parts(&[ring.clone(), vec![[0.0, 0.0], [0.1, 0.1]]], 4);
        // The repeated position left out; the second part, too short, dropped.
        assert_eq!(g.lengths, vec![4]);
        assert_eq!(g.coords, vec![0, 0, 4, 0, 0, 4, -4, -4]);
        let every = Quantization { view: false, ..q };
        assert_eq!(every.parts(&[ring], 4).lengths, vec![5]);
        // A tolerance too fine for i64 saturates; it does not overflow.
        let fine = Quantization { scale: 1e-300, ..q };
        let g = fine.parts(&[vec![[-170.0, 80.0], [170.0, -80.0]]], 2);
        assert_eq!(g.coords.len(), 4);
        // A point is absolute.
        let p = geometry(&json!({"x": 11.0, "y": 19.0}), &q).unwrap();
        assert_eq!((p.lengths.len(), p.coords), (0, vec![2, 2]));
    }

    #[test]
    fn a_count_reads_back() {
        let bytes = wrap(Results::CountResult(CountResult { count: 3231 }));
        let back = FeatureCollectionPBuffer::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            back.query_result.unwrap().results,
            Some(Results::CountResult(CountResult { count: 3231 }))
        );
    }
}
